package io.rmqha.interop;

import org.apache.rocketmq.common.MQVersion;

/** Prints the RocketMQ client version the drivers were built against (a build smoke check). */
public final class Version {
    private Version() {
    }

    public static void main(String[] args) {
        System.out.println(MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION));
    }
}

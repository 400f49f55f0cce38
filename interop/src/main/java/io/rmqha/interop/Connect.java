package io.rmqha.interop;

import java.util.UUID;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.netty.TlsSystemConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * How every driver reaches the cluster the Python fixture started (tests/interop/conftest.py).
 *
 * <p>The environment names the name server ({@code INTEROP_NAMESRV}) and, when the brokers
 * check ACL, the account ({@code INTEROP_ACCESS_KEY}, {@code INTEROP_SECRET_KEY}) that
 * {@link AclClientRPCHook} signs every request with.  TLS comes from RocketMQ's own system
 * properties ({@code -Dtls.enable=true -Dtls.client.*}, read by {@link TlsSystemConfig}),
 * exactly as an application configures it; nothing here bypasses the client's own paths.
 */
public final class Connect {
    private Connect() {
    }

    public static String namesrv() {
        String addr = System.getenv("INTEROP_NAMESRV");
        if (addr == null || addr.isEmpty()) {
            throw new IllegalStateException("INTEROP_NAMESRV is not set: run the driver from tests/interop");
        }
        return addr;
    }

    /** The account's signing hook, or null when no account is given (plaintext mode). */
    public static RPCHook rpcHook() {
        String accessKey = System.getenv("INTEROP_ACCESS_KEY");
        String secretKey = System.getenv("INTEROP_SECRET_KEY");
        if (accessKey == null || accessKey.isEmpty()) {
            return null;
        }
        return new AclClientRPCHook(new SessionCredentials(accessKey, secretKey));
    }

    /**
     * Every client call's timeout: {@code INTEROP_TIMEOUT_MS} (default 20 s, not the client's
     * 3 s: the tests share two cores with other clusters, and a starved JVM's first calls
     * are slow; a lost answer still fails, only later).
     */
    public static int timeoutMs() {
        String value = System.getenv("INTEROP_TIMEOUT_MS");
        return value == null || value.isEmpty() ? 20_000 : Integer.parseInt(value);
    }

    /** Name server, TLS, timeouts and a unique instance name (two drivers never share a client). */
    public static <T extends ClientConfig> T configure(T client) {
        client.setNamesrvAddr(namesrv());
        client.setUseTLS(TlsSystemConfig.tlsEnable);
        client.setMqClientApiTimeout(timeoutMs());
        client.setInstanceName("interop-" + UUID.randomUUID().toString().substring(0, 8));
        return client;
    }

    public static <T extends DefaultMQProducer> T configureProducer(T producer) {
        configure(producer);
        producer.setSendMsgTimeout(timeoutMs());
        return producer;
    }

    public static DefaultMQProducer producer(String group) {
        return configureProducer(new DefaultMQProducer(group, rpcHook()));
    }

    public static TransactionMQProducer transactionProducer(String group) {
        return configureProducer(new TransactionMQProducer(group, rpcHook()));
    }

    public static DefaultMQAdminExt admin() {
        RPCHook hook = rpcHook();
        DefaultMQAdminExt admin = hook == null ? new DefaultMQAdminExt() : new DefaultMQAdminExt(hook);
        return configure(admin);
    }
}

package io.rmqha.interop;

import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.message.MessageRequestMode;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * Sets a group's message request mode on every master of a topic with
 * {@code DefaultMQAdminExt.setMessageRequestMode} (what mqadmin's {@code setConsumeMode}
 * sends: SET_MESSAGE_REQUEST_MODE), so push consumers with {@code clientRebalance=false}
 * pop.  Prints {@code mode} per broker.  Options: {@code --group --topic [--mode POP|PULL]
 * [--pop-share-queue-num 0]}.
 */
public final class RequestMode {
    private RequestMode() {
    }

    public static void main(String[] argv) throws Exception {
        DriverArgs args = DriverArgs.parse(argv);
        Clients.systemProperties(args);
        DefaultMQAdminExt admin = Connect.rpcHook() == null ? new DefaultMQAdminExt()
            : new DefaultMQAdminExt(Connect.rpcHook());
        Clients.configure(admin, args);
        admin.start();
        try {
            String topic = args.need("topic");
            MessageRequestMode mode = MessageRequestMode.valueOf(args.or("mode", "POP"));
            TopicRouteData route = admin.examineTopicRouteInfo(topic);
            for (BrokerData broker : route.getBrokerDatas()) {
                String master = broker.getBrokerAddrs().get(MixAll.MASTER_ID);
                admin.setMessageRequestMode(master, topic, args.need("group"), mode,
                    args.intOr("pop-share-queue-num", 0), 5000);
                Out.emit("event", "mode", "broker", broker.getBrokerName(), "address", master, "mode", mode.name());
            }
        } finally {
            admin.shutdown();
        }
        System.exit(0);
    }
}

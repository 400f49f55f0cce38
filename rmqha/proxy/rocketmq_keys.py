"""The keys of RocketMQ's own proxy config, so its ``rmq-proxy.json`` starts an rmqha proxy.

:data:`ROCKETMQ_PROXY_KEYS` lists every field of RocketMQ 5's ``ProxyConfig``
(``proxy/src/main/java/org/apache/rocketmq/proxy/config/ProxyConfig.java``).  A key
RocketMQ knows and :class:`~rmqha.proxy.config.ProxyConfig` has no field for (thread-pool
sizes, caches, metrics, the remoting port, ...) is accepted and ignored, and the proxy
names those keys once at start; :func:`check_ignored_value` refuses the few whose value
asks for something rmqha does not provide, so that is not ignored silently either.
"""
from __future__ import annotations

from typing import Any

from rmqha.errors import ConfigError

#: Every field of RocketMQ's ProxyConfig (apache/rocketmq 5.3, 2025-09).
ROCKETMQ_PROXY_KEYS = frozenset("""
    rocketMQClusterName proxyClusterName proxyName localServeAddr
    heartbeatSyncerTopicClusterName heartbeatSyncerThreadPoolNums
    heartbeatSyncerThreadPoolQueueCapacity heartbeatSyncerTopicName enablePrintJstack
    printJstackInMillis printThreadPoolStatusInMillis namesrvAddr namesrvDomain
    namesrvDomainSubgroup tlsTestModeEnable tlsKeyPath tlsCertPath tlsCertWatchIntervalMs
    proxyMode grpcServerPort grpcShutdownTimeSeconds grpcBossLoopNum grpcWorkerLoopNum
    enableGrpcEpoll grpcThreadPoolNums grpcThreadPoolQueueCapacity brokerConfigPath
    grpcMaxInboundMessageSize maxMessageSize enableMessageBodyEmptyCheck maxUserPropertySize
    userPropertyMaxNum maxMessageGroupSize defaultInvisibleTimeMills
    minInvisibleTimeMillsForRecv maxInvisibleTimeMills maxDelayTimeMills
    maxTransactionRecoverySecond enableTopicMessageTypeCheck grpcClientProducerMaxAttempts
    grpcClientProducerBackoffInitialMillis grpcClientProducerBackoffMaxMillis
    grpcClientProducerBackoffMultiplier grpcClientConsumerMinLongPollingTimeoutMillis
    grpcClientConsumerMaxLongPollingTimeoutMillis grpcClientConsumerLongPollingBatchSize
    grpcClientIdleTimeMills channelExpiredInSeconds contextExpiredInSeconds
    rocketmqMQClientNum grpcProxyRelayRequestTimeoutInSeconds grpcProducerThreadPoolNums
    grpcProducerThreadQueueCapacity grpcConsumerThreadPoolNums
    grpcConsumerThreadQueueCapacity grpcRouteThreadPoolNums grpcRouteThreadQueueCapacity
    grpcClientManagerThreadPoolNums grpcClientManagerThreadQueueCapacity
    grpcTransactionThreadPoolNums grpcTransactionThreadQueueCapacity
    producerProcessorThreadPoolNums producerProcessorThreadPoolQueueCapacity
    consumerProcessorThreadPoolNums consumerProcessorThreadPoolQueueCapacity
    useEndpointPortFromRequest topicRouteServiceCacheExpiredSeconds
    topicRouteServiceCacheRefreshSeconds topicRouteServiceCacheMaxNum
    topicRouteServiceThreadPoolNums topicRouteServiceThreadPoolQueueCapacity
    topicConfigCacheExpiredSeconds topicConfigCacheRefreshSeconds topicConfigCacheMaxNum
    subscriptionGroupConfigCacheExpiredSeconds subscriptionGroupConfigCacheRefreshSeconds
    subscriptionGroupConfigCacheMaxNum userCacheExpiredSeconds userCacheRefreshSeconds
    userCacheMaxNum aclCacheExpiredSeconds aclCacheRefreshSeconds aclCacheMaxNum
    metadataThreadPoolNums metadataThreadPoolQueueCapacity
    transactionHeartbeatThreadPoolNums transactionHeartbeatThreadPoolQueueCapacity
    transactionHeartbeatPeriodSecond transactionHeartbeatBatchNum
    transactionDataExpireScanPeriodMillis transactionDataMaxWaitClearMillis
    transactionDataExpireMillis transactionDataMaxNum longPollingReserveTimeInMillis
    invisibleTimeMillisWhenClear enableProxyAutoRenew maxRenewRetryTimes renewThreadPoolNums
    renewMaxThreadPoolNums renewThreadPoolQueueCapacity lockTimeoutMsInHandleGroup
    renewAheadTimeMillis renewMaxTimeMillis renewSchedulePeriodMillis
    enableAclRpcHookForClusterMode useDelayLevel messageDelayLevel metricCollectorMode
    metricCollectorAddress regionId traceOn metricsExporterType metricsGrpcExporterTarget
    metricsGrpcExporterHeader metricGrpcExporterTimeOutInMills
    metricGrpcExporterIntervalInMills metricLoggingExporterIntervalInMills
    metricsPromExporterPort metricsPromExporterHost metricsLabel metricsInDelta
    channelExpiredTimeout enableRemotingLocalProxyGrpc localProxyConnectTimeoutMs
    remotingAccessAddr remotingListenPort sendLatencyEnable startDetectorEnable
    detectTimeout detectInterval remotingHeartbeatThreadPoolNums
    remotingTopicRouteThreadPoolNums remotingSendMessageThreadPoolNums
    remotingPullMessageThreadPoolNums remotingUpdateOffsetThreadPoolNums
    remotingDefaultThreadPoolNums remotingHeartbeatThreadPoolQueueCapacity
    remotingTopicRouteThreadPoolQueueCapacity remotingSendThreadPoolQueueCapacity
    remotingPullThreadPoolQueueCapacity remotingUpdateOffsetThreadPoolQueueCapacity
    remotingDefaultThreadPoolQueueCapacity remotingWaitTimeMillsInSendQueue
    remotingWaitTimeMillsInPullQueue remotingWaitTimeMillsInHeartbeatQueue
    remotingWaitTimeMillsInUpdateOffsetQueue remotingWaitTimeMillsInTopicRouteQueue
    remotingWaitTimeMillsInDefaultQueue enableBatchAck
""".split())

#: Ignored keys whose set value would change what the proxy does -> what rmqha offers instead.
_REFUSED_WHEN_SET = {
    "tlsCertPath": "the gRPC port's certificate is tls.server.certPath (with tls.server.mode)",
    "tlsKeyPath": "the gRPC port's key is tls.server.keyPath (with tls.server.mode)",
}


def check_ignored_value(key: str, value: Any, source: str) -> None:
    """ConfigError if ignoring ``key`` = ``value`` would hide a behaviour the operator asked for."""
    instead = _REFUSED_WHEN_SET.get(key)
    if instead is not None and str(value).strip():
        raise ConfigError(f"{key} in {source} is not used by rmqha: {instead}")


def ignored_keys_line(keys: list[str]) -> str:
    """The one line the proxy logs at start about the keys it ignores."""
    return "config keys of RocketMQ's proxy not used by rmqha: " + ", ".join(keys)

"""The Settings the proxy answers a client's Telemetry Settings with
(``GrpcClientSettingsManager``).

A producer gets the client's settings back with the proxy's send policy: retry attempts
and exponential backoff (``grpcClientProducer*``), the largest body it may send
(``maxMessageSize``) and whether message types are checked.  A consumer gets its
subscription with the receive batch size and the longest long poll
(``grpcClientConsumer*``), whether the group is FIFO (the group's
``consumeMessageOrderly``), and the group's retry policy: attempts = ``retryMaxTimes`` + 1
and the backoff of its ``groupRetryPolicy`` (RocketMQ's default: the delay levels 1s ... 2h
as a customized backoff).  Metrics export is off.
"""
from __future__ import annotations

from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from rmqha.protocol.groups import SubscriptionGroupConfig
from rmqha.proxy.config import ProxyConfig
from rmqha.proxy.renewal_logic import DEFAULT_RETRY_NEXT_MS


def _duration(target: Any, ms: int) -> None:
    target.seconds, rest = divmod(int(ms), 1000)
    target.nanos = rest * 1_000_000


def producer_settings(client: Any, cfg: ProxyConfig) -> Any:
    out = pb.Settings()
    out.CopyFrom(client)
    policy = out.backoff_policy
    policy.max_attempts = cfg.grpc_client_producer_max_attempts
    _duration(policy.exponential_backoff.initial, cfg.grpc_client_producer_backoff_initial_millis)
    _duration(policy.exponential_backoff.max, cfg.grpc_client_producer_backoff_max_millis)
    policy.exponential_backoff.multiplier = cfg.grpc_client_producer_backoff_multiplier
    out.publishing.validate_message_type = cfg.enable_topic_message_type_check
    out.publishing.max_body_size = cfg.max_message_size
    out.metric.on = False
    return out


def _retry_policy(group: SubscriptionGroupConfig) -> dict[str, Any]:
    raw = group.extra.get("groupRetryPolicy")
    return raw if isinstance(raw, dict) else {}


def _backoff(policy: Any, group: SubscriptionGroupConfig) -> None:
    """The group's ``groupRetryPolicy`` as the client's backoff."""
    raw = _retry_policy(group)
    if str(raw.get("type", "CUSTOMIZED")).upper() == "EXPONENTIAL":
        exp = raw.get("exponentialRetryPolicy") or {}
        _duration(policy.exponential_backoff.initial, int(exp.get("initial", 5000)))
        _duration(policy.exponential_backoff.max, int(exp.get("max", 7200000)))
        policy.exponential_backoff.multiplier = float(exp.get("multiplier", 2))
        return
    custom = raw.get("customizedRetryPolicy") or {}
    steps = custom.get("next") or DEFAULT_RETRY_NEXT_MS
    for ms in steps:
        _duration(policy.customized_backoff.next.add(), int(ms))


def consumer_settings(client: Any, cfg: ProxyConfig, group: SubscriptionGroupConfig) -> Any:
    out = pb.Settings()
    out.CopyFrom(client)
    sub = out.subscription
    sub.receive_batch_size = cfg.grpc_client_consumer_long_polling_batch_size
    _duration(sub.long_polling_timeout, cfg.grpc_client_consumer_max_long_polling_timeout_millis)
    sub.fifo = group.consume_message_orderly
    out.backoff_policy.Clear()
    out.backoff_policy.max_attempts = group.retry_max_times + 1
    _backoff(out.backoff_policy, group)
    out.metric.on = False
    return out


def default_group(name: str) -> SubscriptionGroupConfig:
    """The settings of a group nobody created (brokers create it on its first pop)."""
    return SubscriptionGroupConfig(group_name=name)

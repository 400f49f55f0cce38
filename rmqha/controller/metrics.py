"""Prometheus metrics of one controller (one CollectorRegistry per controller).

Names follow ``rmqha_<subsystem>_<name>_<unit>``; label values follow RocketMQ's controller
metrics (``request_type`` is the upper-case code name, election results
``new_master_elected`` / ``keep_current_master`` / ``no_master_elected``).
"""
from __future__ import annotations

from rmqha.protocol.codes import ResponseCode, code_name
from rmqha.metrics import MetricsRegistry
from rmqha.security.tls import TlsSettings


class ControllerMetrics:
    """The controller's series, in its own :class:`MetricsRegistry` or in a host process's
    (a name server embedding a controller passes its registry)."""

    def __init__(self, group: str, peer_id: str, registry: MetricsRegistry | None = None) -> None:
        self.metrics = registry or MetricsRegistry()
        self._owns_registry = registry is None
        self.registry = self.metrics.registry
        common = {"group": group, "peer_id": peer_id}
        self._common = common
        m = self.metrics
        self.requests = m.counter(
            "rmqha_controller_requests", "Controller requests by code and result",
            ("group", "peer_id", "request_type", "result"))
        self.elections = m.counter(
            "rmqha_controller_elections", "Master elections by result",
            ("group", "peer_id", "broker_set", "result"))
        self.raft_role = m.gauge(
            "rmqha_controller_raft_role", "Raft role (0 unknown, 1 candidate, 2 follower, 3 leader)",
            ("group", "peer_id"))
        self.raft_term = m.gauge("rmqha_controller_raft_term", "Raft term", ("group", "peer_id"))
        self.commit_latency = m.histogram(
            "rmqha_controller_commit_latency_seconds",
            "Time from submit to applied, per committed Raft entry", ("group", "peer_id"))
        self.active_brokers = m.gauge(
            "rmqha_controller_active_brokers", "Brokers with a live heartbeat", ("group", "peer_id"))

    def request(self, code: int, response_code: int) -> None:
        if response_code == ResponseCode.SUCCESS:
            result = "success"
        elif response_code == ResponseCode.CONTROLLER_NOT_LEADER:
            result = "not_leader"
        else:
            result = "failed"
        self.requests.labels(**self._common, request_type=code_name(code), result=result).inc()

    def election(self, broker_set: str, response_code: int) -> None:
        if response_code == ResponseCode.SUCCESS:
            result = "new_master_elected"
        elif response_code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST:
            result = "keep_current_master"
        else:
            result = "no_master_elected"
        self.elections.labels(**self._common, broker_set=broker_set, result=result).inc()

    def raft(self, role: int, term: int) -> None:
        self.raft_role.labels(**self._common).set(role)
        self.raft_term.labels(**self._common).set(term)

    def commit(self, seconds: float) -> None:
        self.commit_latency.labels(**self._common).observe(seconds)

    def brokers(self, count: int) -> None:
        self.active_brokers.labels(**self._common).set(count)

    def start_http(self, host: str, port: int, tls: TlsSettings | None = None) -> int:
        return self.metrics.serve(port, host, tls=tls)

    def stop(self) -> None:
        if self._owns_registry:
            self.metrics.stop()

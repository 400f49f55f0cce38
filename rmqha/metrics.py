"""Prometheus metrics plumbing shared by every rmqha process.

Each process (or each in-process node in tests) owns one :class:`MetricsRegistry`, so two
nodes in one interpreter never collide on series names.  Names follow
``rmqha_<area>_<name>_<unit>`` in base units; prometheus_client appends ``_total`` to
counters itself.  ``serve`` exposes the registry over HTTP on the configured port, or over
HTTPS with the process's ``tls.server.*`` certificate (its files are read once, at start).
"""
from __future__ import annotations

import ssl
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import disable_created_metrics

from rmqha.errors import ConfigError
from rmqha.metrics_http import serve_metrics
from rmqha.security.tls import ClientAuth, TlsSettings

disable_created_metrics()

#: Latency buckets in seconds, from 50 us to 10 s (RocketMQ's controller uses a similar spread).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


class MetricsRegistry:
    """A per-process registry with helpers that enforce the naming scheme."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def _get(self, kind: type, name: str, doc: str, labels: tuple[str, ...], **kw: Any) -> Any:
        if not name.startswith("rmqha_"):
            raise ValueError(f"metric {name!r} must be named rmqha_<area>_<name>_<unit>")
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = kind(name, doc, labels, registry=self.registry, **kw)
                self._metrics[name] = metric
            return metric

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return self._get(Counter, name, doc, labels)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return self._get(Gauge, name, doc, labels)

    def histogram(
        self, name: str, doc: str, labels: tuple[str, ...] = (),
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> Histogram:
        return self._get(Histogram, name, doc, labels, buckets=buckets)

    def serve(self, port: int, host: str = "127.0.0.1", tls: TlsSettings | None = None) -> int:
        """Serve /metrics on host:port (0 picks a free port); returns the bound port.
        With ``tls``: HTTPS with its server certificate, and client certificates checked
        against its trust file when ``tls.server.need.client.auth`` asks for them."""
        try:
            self._server, self._thread = serve_metrics(self.registry, host, port, _https_context(tls))
        except OSError as exc:
            raise ConfigError(f"metrics_port {port} on {host} cannot be bound: {exc.strerror}") from exc
        return int(self._server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _https_context(tls: TlsSettings | None) -> ssl.SSLContext | None:
    """The /metrics port's TLS context for ``tls`` (None for plain HTTP)."""
    if tls is None:
        return None
    if not tls.server_cert_path or not tls.server_key_path:
        raise ConfigError("https_enable needs tls.server.certPath and tls.server.keyPath")
    if tls.server_key_password:
        raise ConfigError("https_enable: /metrics cannot use a key with tls.server.keyPassword; "
                          "give it an unencrypted key file (mode 600)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.server_cert_path, tls.server_key_path)
    if tls.server_need_client_auth is not ClientAuth.NONE:
        if not tls.server_trust_cert_path:
            raise ConfigError("https_enable with client certificates needs tls.server.trustCertPath")
        context.load_verify_locations(cafile=tls.server_trust_cert_path)
        context.verify_mode = (ssl.CERT_REQUIRED if tls.server_need_client_auth is ClientAuth.REQUIRE
                               else ssl.CERT_OPTIONAL)
    return context

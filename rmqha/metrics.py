"""Prometheus metrics plumbing shared by every rmqha process.

Each process (or each in-process node in tests) owns one :class:`MetricsRegistry`, so two
nodes in one interpreter never collide on series names.  Names follow
``rmqha_<area>_<name>_<unit>`` in base units; prometheus_client appends ``_total`` to
counters itself.  ``serve`` exposes the registry over HTTP on the configured port, or over
HTTPS with the process's ``tls.server.*`` certificate (its files are read once, at start).

The port is rmqha's own server around prometheus_client's WSGI app
(:class:`MetricsHttpServer`): prometheus_client's ``start_http_server`` runs each TLS
handshake in its one accept thread with no timeout and reads requests without one, so a
peer that connects and says nothing stalls every scrape behind it (TLS) or holds a thread
forever (plain).  Here each connection gets its own thread at once and a socket deadline
of :data:`PEER_TIMEOUT_S` for the handshake and every read and write, as the remoting
ports' 10 s deadline; at most :data:`MAX_CONNECTIONS` are served at once (Prometheus
scrapes with one), more are closed at accept.
"""
from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import disable_created_metrics, make_wsgi_app

from rmqha.errors import ConfigError
from rmqha.security.tls import ClientAuth, TlsSettings

log = logging.getLogger(__name__)

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


#: A connection's TLS handshake, and each read or write of a request, within this long.
PEER_TIMEOUT_S = 10.0
#: Connections served at once.
MAX_CONNECTIONS = 16


class _Handler(WSGIRequestHandler):
    timeout = PEER_TIMEOUT_S  # StreamRequestHandler.setup() puts it on the socket

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        """Scrapes are not logged."""


class MetricsHttpServer(WSGIServer):
    """A threading WSGI server with the deadlines and the cap of the module docstring."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._tls = tls
        self._open = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._open.acquire(blocking=False):
            log.info("/metrics: closed a connection from %s: %d already open", client_address[0],
                     MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        threading.Thread(target=self._serve, args=(request, client_address), daemon=True).start()

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            request.settimeout(PEER_TIMEOUT_S)
            if self._tls is not None:
                request = self._tls.wrap_socket(request, server_side=True)
            self.finish_request(request, client_address)
        except (OSError, ValueError) as exc:  # ssl.SSLError and socket.timeout are OSErrors
            log.debug("/metrics: connection from %s dropped: %s", client_address[0], exc)
        finally:
            self.shutdown_request(request)
            self._open.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("/metrics: error serving %s", client_address[0], exc_info=True)


def serve_metrics(registry: CollectorRegistry, host: str, port: int,
                  tls: ssl.SSLContext | None = None) -> tuple[MetricsHttpServer, threading.Thread]:
    """Serve ``registry`` at host:port (0 picks one) in a daemon thread; OSError when the
    port cannot be bound."""
    server = MetricsHttpServer(host, port, tls)
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name=f"metrics-{host}:{server.server_port}",
                              daemon=True)
    thread.start()
    return server, thread

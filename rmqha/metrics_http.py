"""The /metrics port: prometheus_client's WSGI app on a server that drops stalled peers.

prometheus_client's ``start_http_server`` accepts and, over TLS, runs each handshake in
its one accept thread with no timeout, then reads requests without one: a peer that
connects and says nothing stalls every scrape behind it (TLS) or holds a thread forever
(plain).  Here each connection gets its own thread at once and a socket deadline of
:data:`PEER_TIMEOUT_S` for the TLS handshake and for every read and write of a request,
as the remoting ports' 10 s handshake deadline; at most :data:`MAX_CONNECTIONS` are
served at once (Prometheus scrapes with one), more are closed at accept.
"""
from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)

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

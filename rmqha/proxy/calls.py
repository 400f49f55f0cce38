"""What the proxy reads from a gRPC call besides its request: who calls, from where, until
when (RocketMQ's ``ProxyContext``, filled by its ``ContextInitPipeline``)."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rmqha.errors import ProxyError
from rmqha.proxy.status import Code

CLIENT_ID = "x-mq-client-id"
NAMESPACE = "x-mq-namespace"


class Call:
    """One call's caller.  The peer's address is read from grpc only when asked for (the
    ACL, a message without a born host): most calls never need it."""

    def __init__(self, client_id: str, peer: Callable[[], str | None], metadata: dict[str, str],
                 remaining_s: float | None) -> None:
        self.client_id = client_id
        self.metadata = metadata
        #: Seconds left before the client's deadline (None: it set none).
        self.remaining_s = remaining_s
        self._peer = peer

    @functools.cached_property
    def peer_host(self) -> str:
        """The caller's IP address (no port)."""
        return peer_host(self._peer() or "")

    def budget_s(self, default: float) -> float:
        """How long the proxy may take: the client's deadline, else ``default``."""
        return default if self.remaining_s is None else max(0.0, self.remaining_s)


def peer_host(peer: str) -> str:
    """The address of gRPC's ``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` peer string."""
    _, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if rest.count(":") >= 1 else rest
    return host.strip("[]") or "127.0.0.1"


def call_of(context: Any, *, need_client_id: bool = True) -> Call:
    """The :class:`Call` of a grpc.aio servicer context; CLIENT_ID_REQUIRED without an id."""
    # grpc hands metadata keys over lower case (HTTP/2 header names); values of text keys
    # are str already.
    metadata = dict(context.invocation_metadata() or ())
    client_id = metadata.get(CLIENT_ID, "")
    if need_client_id and not client_id.strip():
        raise ProxyError(Code.CLIENT_ID_REQUIRED, "client id cannot be empty")
    return Call(client_id, context.peer, metadata, context.time_remaining())

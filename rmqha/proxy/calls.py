"""What the proxy reads from a gRPC call besides its request: who calls, from where, until
when (RocketMQ's ``ProxyContext``, filled by its ``ContextInitPipeline``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rmqha.errors import ProxyError
from rmqha.proxy.status import Code

CLIENT_ID = "x-mq-client-id"
NAMESPACE = "x-mq-namespace"


@dataclass(frozen=True)
class Call:
    client_id: str
    #: The caller's IP address (no port).
    peer_host: str
    metadata: dict[str, str]
    #: Seconds left before the client's deadline (None: it set none).
    remaining_s: float | None

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
    metadata = {str(k).lower(): str(v) for k, v in (context.invocation_metadata() or ())}
    client_id = metadata.get(CLIENT_ID, "")
    if need_client_id and not client_id.strip():
        raise ProxyError(Code.CLIENT_ID_REQUIRED, "client id cannot be empty")
    return Call(client_id, peer_host(context.peer() or ""), metadata, context.time_remaining())

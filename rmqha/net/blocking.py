"""The blocking remoting client: a :class:`RemotingClient` driven from a private loop thread."""
from __future__ import annotations

from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.command import RemotingCommand


class BlockingRemotingClient:
    """Blocking façade over :class:`RemotingClient` (its loop runs on a private thread)."""

    def __init__(self, addr: str, *, connect_timeout: float = 3.0,
                 security: ClientSecurity | None = None, expect: ServerRole | None = None) -> None:
        self._loop = EventLoopThread(f"rmqha-remoting-{addr}")
        self._client = RemotingClient(addr, connect_timeout=connect_timeout, security=security,
                                      expect=expect)
        self.addr = addr

    def request(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        return self._loop.run(self._client.request(cmd, timeout))

    def oneway(self, cmd: RemotingCommand) -> None:
        self._loop.run(self._client.oneway(cmd))

    def close(self) -> None:
        try:
            self._loop.run(self._client.close(), timeout=5)
        finally:
            self._loop.stop()

    def __enter__(self) -> BlockingRemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

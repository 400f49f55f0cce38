"""The broker's fence on write codes: only a master takes a request that appends messages.

Until the controller has told a broker its role, and whenever it is a slave, every code of
:data:`rmqha.protocol.code_rules.APPEND_CODES` is refused before its handler runs, even a
code the messaging layer does not serve (RocketMQ's fencing, apache/rocketmq#6508).  The
refusal is :func:`rmqha.messaging.verdict.verdict`'s, as every other write refusal: this
fence reports only the role; the lease and the in-sync floor are the messaging layer's facts.
A slave's refusal names its master (``masterAddress``), so clients re-route at once instead
of waiting for the name server.

The three wrappers match the dispatcher's three ways in: a task-based handler, an immediate
handler (or a plain send), and a run of plain sends; the latter two take nothing unless the
broker is master, and what they leave goes the task-based way, which refuses it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rmqha.broker.replicas_manager import Role
from rmqha.messaging.verdict import ANSWERS, Copies, Flush, Outcome, verdict
from rmqha.net.dispatcher import Handler, LanePeer, PlainSendsHandler
from rmqha.net.peer import RequestPeer
from rmqha.protocol.code_rules import APPEND_CODES
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.command import RemotingCommand, SendFrame


class RoleFence:
    """Wraps handlers so that write codes run only while ``role()`` is master."""

    def __init__(self, role: Callable[[], Role], master_address: Callable[[], str | None],
                 broker_address: str, broker_name: str) -> None:
        self._role = role
        self._master_address = master_address
        self._broker_address = broker_address
        self._broker_name = broker_name

    def refusal(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """The answer refusing ``cmd`` on this broker now; None while it is master."""
        role = self._role()
        outcome = verdict(role == Role.MASTER, True, 1, 0, Copies.UNASKED, Flush.NONE)
        if outcome == Outcome.PUT_OK:
            return None
        code, _status = ANSWERS[outcome]
        master = self._master_address()
        if role == Role.SLAVE and master:
            remark = f"broker {self._broker_address} is a slave; the master of {self._broker_name} is {master}"
            return cmd.response(code, remark, {"masterAddress": master})
        remark = f"broker {self._broker_address} is fenced: its role is not confirmed by the controller yet"
        return cmd.response(code, remark, {})

    def task(self, code: int, handler: Handler | None) -> Handler:
        """``handler`` for ``code``, refused off master when ``code`` appends (a write code
        without a handler is still fenced, then answered not supported)."""

        async def fenced(cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand | None:
            refused = self.refusal(cmd)
            if refused is not None:
                return refused
            if handler is None:
                return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
            return await handler(cmd, conn)

        if code in APPEND_CODES:
            return fenced
        if handler is None:
            raise ValueError(f"request code {code} has no handler and appends nothing")
        return handler

    def now(self, handler: Callable[[Any, LanePeer], bool]) -> Callable[[Any, LanePeer], bool]:
        """An immediate (or plain send) handler that takes the request only on a master."""

        def fenced_now(request: Any, conn: LanePeer) -> bool:
            return self._role() == Role.MASTER and handler(request, conn)

        return fenced_now

    def run(self, handler: PlainSendsHandler) -> PlainSendsHandler:
        """A plain-sends run handler that takes none of the run off master."""

        def fenced_run(sends: Sequence[SendFrame], conn: LanePeer) -> int:
            return handler(sends, conn) if self._role() == Role.MASTER else 0

        return fenced_run


"""Request code -> handler on a remoting connection, and what a handler may ask of its peer.

Ordinary handlers are typed on :class:`rmqha.net.peer.RequestPeer`; the lanes that answer
in the loop turn that decoded a request (immediate handlers, plain sends, the guard) on
:class:`LanePeer`, which adds answering in place.  Keeping the lane types and the
:class:`Dispatcher` here, below :mod:`rmqha.net.connection`, lets the modules that register
handlers name their types without importing the connection (a type-only cycle otherwise:
the connection dispatches to them), and keeps ``connection.py`` to frames and transport.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol

from rmqha.net.peer import RequestPeer
from rmqha.protocol.command import RemotingCommand, SendFrame, not_supported
from rmqha.security.identity import Identity, Role


class LanePeer(RequestPeer, Protocol):
    """What the request lanes that answer without a task (immediate handlers, plain sends,
    the guard) use besides :class:`~rmqha.net.peer.RequestPeer`: answering in place,
    batching writes to the end of a dispatch, and who the peer proved to be."""

    name: str
    tls: bool

    @property
    def closed(self) -> bool: ...

    def require_peer(self, *, roles: Collection[Role] | None = None,
                     expected: Identity | None = None, cluster: str | None = None,
                     group: str | None = None) -> Identity: ...

    def answer(self, request: RemotingCommand, response: RemotingCommand) -> None: ...

    def answer_frame(self, data: bytes) -> None: ...

    def answer_frames(self, frames: list[bytes]) -> None: ...

    def answer_chunk(self, data: bytes, count: int) -> None: ...

    def at_end_of_dispatch(self, cb: Callable[[], None]) -> None: ...


#: ``handler(cmd, conn) -> response``: the ordinary, task-based handler of a code (None:
#: no answer, for a oneway request).
Handler = Callable[[RemotingCommand, RequestPeer], Awaitable[RemotingCommand | None]]

#: ``guard(cmd, conn) -> None``: runs before any handler of a request; a refusal is a
#: :class:`~rmqha.errors.RemoteCommandError` (answered with its code and remark, and no handler
#: runs).  The broker's ACL check is one.
Guard = Callable[[RemotingCommand, LanePeer], None]

#: ``handler(cmd, conn) -> bool``: takes the request in the loop turn that decoded it (True:
#: it answers with :meth:`RequestPeer.answer`, now or from a later callback) or leaves it to
#: the code's ordinary task-based handler (False).
ImmediateHandler = Callable[[RemotingCommand, LanePeer], bool]

#: ``handler(send, conn) -> bool``: takes a plain send parsed from its frame (no command
#: made; see :class:`~rmqha.protocol.command.FrameDecoder`) and answers it with
#: :meth:`RequestPeer.answer_frame` or :meth:`RequestPeer.answer` (True), or leaves it to
#: the ordinary way, as the command its frame decodes to (False).
PlainSendHandler = Callable[[SendFrame, LanePeer], bool]

#: ``handler(sends, conn) -> int``: :data:`PlainSendHandler` for a run of plain sends that
#: arrived together, in one call: how many of them, from the first, it took (and answers);
#: the one after those goes the ordinary way.  It answers a failure of its own on a send
#: it took (SYSTEM_ERROR) rather than raise.
PlainSendsHandler = Callable[[Sequence[SendFrame], LanePeer], int]

#: ``plain_guard(send, conn) -> bool``: with a :data:`Guard`, whether a plain send (parsed
#: with its ACL signing material) passes it as its command would; False leaves the send to
#: the guard, as that command.
PlainGuard = Callable[[SendFrame, LanePeer], bool]


class Dispatcher:
    """Request code -> handler, with an optional fallback handler for other codes.

    A code may also have an immediate handler (:meth:`register_immediate`), tried first
    without a task: a one-at-a-time request then costs no task creation and no task steps,
    which on the send path is a good part of the broker's time per message."""

    def __init__(self, fallback: Handler | Mapping[int, Handler] | None = None) -> None:
        self._handlers: dict[int, Handler] = {}
        self._fallback: Handler | None = None
        self.immediate: dict[int, ImmediateHandler] = {}
        #: Checked before every request (:data:`Guard`); None lets everything through.
        self.guard: Guard | None = None
        #: Plain sends taken from their frames (see :meth:`register_plain_send`).
        self.plain_send: PlainSendHandler | None = None
        self.plain_send_refuse: tuple[bytes, ...] = ()
        #: The same for a run of them (see :meth:`register_plain_sends`).
        self.plain_sends: PlainSendsHandler | None = None
        #: The :attr:`guard`'s check of a plain send (:data:`PlainGuard`); None: a guard
        #: sends every plain send the ordinary way.
        self.plain_guard: PlainGuard | None = None
        if isinstance(fallback, Mapping):
            for code, fn in fallback.items():
                self.register(code, fn)
        else:
            self._fallback = fallback

    def register(self, code: int, handler: Handler) -> None:
        self._handlers[int(code)] = handler

    def register_immediate(self, code: int, handler: ImmediateHandler) -> None:
        self.immediate[int(code)] = handler

    def served_codes(self) -> frozenset[int]:
        """Every code with a handler (tests check each has a declaration,
        :mod:`rmqha.protocol.code_rules`)."""
        return frozenset(self._handlers) | frozenset(self.immediate)

    def register_plain_send(self, handler: PlainSendHandler, refuse: tuple[bytes, ...]) -> None:
        """Connections made from now on parse plain sends from their frames (properties
        holding none of ``refuse``) and give them to ``handler`` before any other
        handler; with a :attr:`guard` they go the ordinary way (the guard reads commands)
        unless :attr:`plain_guard` admits them."""
        self.plain_send = handler
        self.plain_send_refuse = refuse

    def register_plain_sends(self, handler: PlainSendsHandler) -> None:
        """With :meth:`register_plain_send`: the plain sends a dispatch holds back to back
        go to ``handler`` in one call (without a :attr:`guard`; with one, each send is
        checked and goes alone)."""
        self.plain_sends = handler

    async def __call__(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand | None:
        handler = self._handlers.get(cmd.code, self._fallback)
        if handler is None:
            return not_supported(cmd)
        return await handler(cmd, conn)

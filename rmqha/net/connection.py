"""One TCP connection speaking remoting frames, in either direction.

:class:`Connection` is the transport's asyncio protocol: it decodes frames as they arrive
(:class:`rmqha.protocol.command.FrameDecoder`), dispatches requests to handlers
(:class:`rmqha.net.dispatcher.Dispatcher`, code -> handler, typed on the
:class:`~rmqha.net.dispatcher.RequestPeer` part of a connection), matches responses to pending requests by
``opaque`` and writes with back-pressure.  A request may also leave encoded already
(:meth:`Connection.request_frame`): its response comes back as its frame, undecoded (the
decoder's :class:`~rmqha.protocol.command.RawAnswer`).  A producer's send goes as a frame
too (:meth:`Connection.send_frame`), with no coroutine: its answer's fields reach its
future from the compiled call that reads them off the read (matched by opaque, see
``match_send_answers``).  A malformed frame closes that one connection with a logged reason.

Over TLS a connection knows who is on the other end: :attr:`Connection.peer_identity` is
the rmqha identity (``rmqha:broker/C/G/N``, ...) of the peer's *verified* certificate, on
both the accepting and the dialling side, and None for plaintext or a peer without such a
certificate.  A handler that must know its peer (a broker registers only as itself) calls
:meth:`Connection.require_peer`, which refuses with NO_PERMISSION.

A connection may have a *frame layer* (:meth:`Connection.use_layer`, e.g. the
authenticated channel of :mod:`rmqha.net.channel`): it decodes what arrives in place of
the plain decoder and seals every frame that leaves.  Plain connections have none and pay
nothing for it; an accepting layer that finds a plain peer hands the connection back to the
plain decoder (:meth:`Connection.drop_layer`).
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable, Collection, Container, Sequence
from typing import Any, Protocol, TypeVar, cast

from rmqha.errors import (
    AuthenticationError,
    PeerIdentityError,
    ProtocolError,
    RemoteCommandError,
    RemotingError,
    RemotingTimeoutError,
    RmqhaError,
)
from rmqha.net.dispatcher import (
    Dispatcher,
    Guard,
    ImmediateHandler,
    PlainSendsHandler,
)
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.command import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RawAnswer,
    RemotingCommand,
    SendFrame,
    command_of,
    encode,
    match_send_answers,
    not_supported,
)
from rmqha.security.identity import Identity, Role, authorize
from rmqha.security.tls import verified_identity

log = logging.getLogger(__name__)

#: A server drops a peer that sends part of a frame and then nothing for this long (a
#: stalled or malicious client must not hold a connection and its buffer forever).
DEFAULT_FRAME_READ_TIMEOUT_S = 30.0

_T = TypeVar("_T")

#: Bytes queued in a connection's transport above which a sender waits for the kernel.
_WRITE_HIGH_WATER = 1 << 20


class FrameLayer(Protocol):
    """What a connection's frame layer does (see :meth:`Connection.use_layer`)."""

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete."""
        ...

    #: Opaques whose responses :meth:`feed` hands back undecoded (see
    #: :attr:`rmqha.protocol.command.FrameDecoder.raw_answers`).
    raw_answers: Container[int]

    def feed(self, data: bytes) -> Sequence[RemotingCommand | SendFrame | RawAnswer]:
        """The commands whose bytes are complete (ProtocolError / AuthenticationError:
        close the connection, dispatch nothing)."""
        ...

    def seal(self, frame: bytes) -> bytes:
        """The bytes to write for one encoded frame."""
        ...


class _Expired(Exception):
    """A request's timer fired before its response came (becomes RemotingTimeoutError)."""


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


class _Opaques:
    """The opaques whose responses the decoder hands back undecoded: those of
    ``request_frame`` and those of ``send_frame`` (one container over both tables)."""

    __slots__ = ("_raw", "_sends")

    def __init__(self, raw: dict[int, Any], sends: dict[int, Any]) -> None:
        self._raw = raw
        self._sends = sends

    def __contains__(self, opaque: object) -> bool:
        return opaque in self._sends or opaque in self._raw

    def __len__(self) -> int:
        return len(self._sends) + len(self._raw)


#: Commands of one read dispatched in one loop turn; the rest wait for the next turns.
#: A read of 100-200 pipelined sends dispatched at once held the answers to the first
#: behind the storing of the last (their acks are read only after it), so client and
#: master took turns instead of working side by side: 256 sends in flight left half of
#: two CPUs idle.  32 a turn: about 1.2x the throughput (16 costs more turns than it saves).
DISPATCH_BUDGET = 32


class Connection(asyncio.Protocol):
    """One TCP connection speaking remoting frames, in either direction.

    It is the transport's protocol: frames are decoded in the loop turn that reads them
    (a reader task would cost one more turn per read, and a one-at-a-time send pays every
    turn on both sides).  Incoming requests go to the dispatcher, each as its own task, so
    a slow handler never blocks replies to other requests on the same connection, as
    RocketMQ's clients require; incoming responses complete the matching pending request
    right there.
    """

    def __init__(
        self,
        dispatcher: Dispatcher | None,
        max_frame_bytes: int,
        name: str = "",
        frame_read_timeout: float | None = None,
        on_made: Callable[[Connection], None] | None = None,
    ) -> None:
        #: A peer that stops in the middle of a frame for this long is dropped (None: never).
        #: Between frames a connection may idle as long as it likes.
        self._frame_read_timeout = frame_read_timeout
        self._stall_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        #: Whether any byte came from the peer (a server drops a link silent from the start).
        self.heard = False
        self._dispatcher = dispatcher
        self.max_frame_bytes = max_frame_bytes
        plain = dispatcher is not None and dispatcher.plain_send is not None
        decoder = FrameDecoder(max_frame_bytes,
                               dispatcher.plain_send_refuse if plain and dispatcher else None,
                               signed=dispatcher is not None and dispatcher.plain_guard is not None)
        self._decoder: FrameDecoder | FrameLayer = decoder
        self._feed: Callable[[bytes], Sequence[RemotingCommand | SendFrame | RawAnswer]] = (
            decoder.feed_sends if plain else decoder.feed_answers)
        #: The decoder without a layer, for drop_layer().
        self._plain_decoder, self._plain_feed = decoder, self._feed
        #: The frame layer's seal (None: frames leave as encoded).
        self._seal: Callable[[bytes], bytes] | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        #: Requests sent encoded (request_frame()): their responses come back undecoded.
        self._raw: dict[int, asyncio.Future[bytes]] = {}
        #: Sends sent encoded (send_frame()): their answers' fields, or frames undecoded.
        self._sends: dict[int, asyncio.Future[Any]] = {}
        self._raw_opaques = decoder.raw_answers = _Opaques(self._raw, self._sends)
        #: opaque -> loop time its request times out (see request()).
        self._deadlines: dict[int, float] = {}
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Requests an immediate handler took and has not answered yet.
        self._immediate = 0
        self._close_callbacks: list[Callable[[Connection], None]] = []
        self._closed = self._loop.create_future()
        #: Set when the transport is gone (connection_lost), for close() to wait on.
        self._lost = self._loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        #: Frames gathered for one write at the end of the loop turn (see send()).
        self._cork: list[bytes] | None = None
        #: Callbacks to run once the commands being dispatched together are all
        #: dispatched (None outside a dispatch; see at_end_of_dispatch()).
        self._end_of_dispatch: list[Callable[[], None]] | None = None
        #: Commands of a read beyond DISPATCH_BUDGET, dispatched in later loop turns.
        self._backlog: deque[RemotingCommand | SendFrame | RawAnswer] = deque()
        self._drain_scheduled = False
        #: What is left of a read whose first DISPATCH_BUDGET answers were handed to their
        #: sends: taken in the next loop turn (reading paused until then).
        self._deferred = b""
        self._reading_paused = False
        self._on_made = on_made
        self._given_name = name
        self.peer = "?"
        self.name = name or self.peer
        self.close_reason: str | None = None
        #: Free-form per-connection state for handlers (e.g. which broker this is).
        self.attributes: dict[str, Any] = {}
        #: Whether the connection runs over TLS.
        self.tls = False
        #: The identity in the peer's verified TLS certificate; None without one.
        self.peer_identity: Identity | None = None
        #: The identity the peer proved with the cluster secret on an authenticated channel
        #: (:mod:`rmqha.net.channel`); None on a plain connection.
        self.channel_peer: Identity | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._transport is transport:
            return  # attached already (see RemotingClient.connection)
        # uvloop's transports are no asyncio.Transport subclasses, but have its whole API.
        self._transport = stream = cast(asyncio.Transport, transport)
        # Pause (and make senders wait) only past our own high-water mark.
        stream.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        peer = stream.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.name = self._given_name or self.peer
        ssl_object = transport.get_extra_info("ssl_object")
        self.tls = isinstance(ssl_object, (ssl.SSLObject, ssl.SSLSocket))
        self.peer_identity = verified_identity(ssl_object) if self.tls else None
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        if self._closed.done():
            return
        self.heard = True
        if self._sends and not (self._deferred or self._backlog or self._seal is not None):
            if not self._decoder.buffered:
                # The answers a read starts with go to their sends in one compiled call;
                # what it stops at goes the general way below.
                pos, count = match_send_answers(data, self._sends, self._deadlines,
                                                self.max_frame_bytes, DISPATCH_BUDGET)
                if pos:
                    if pos == len(data):
                        return
                    data = data[pos:]
                    if count == DISPATCH_BUDGET:
                        self._defer(data)
                        return
        elif self._deferred:  # a transport that could not pause reading
            self._deferred += data
            return
        try:
            commands = self._feed(data)
        except ProtocolError as exc:
            reason = f"malformed frame: {exc}"
            log.warning("closing connection %s: %s", self.name, reason)
            self._mark_closed(reason)
            return
        except AuthenticationError as exc:
            reason = f"authentication failed: {exc}"
            log.warning("closing connection %s: %s", self.name, reason)
            self._mark_closed(reason)
            return
        if self._backlog or len(commands) > DISPATCH_BUDGET:
            self._backlog.extend(commands)
            if not self._drain_scheduled:
                self._dispatch_some()
        elif len(commands) == 1 and type(commands[0]) is RawAnswer:
            self._on_command(commands[0])  # an answer: nothing is dispatched, nothing to run after
        elif commands:
            self._dispatch(commands)
        if self._frame_read_timeout is not None and self._decoder.buffered:
            self._last_data = self._loop.time()
            if self._stall_timer is None:
                self._stall_timer = self._loop.call_at(
                    self._last_data + self._frame_read_timeout, self._check_stall)

    def _defer(self, rest: bytes) -> None:
        """Take ``rest`` of a read in the next loop turn, as DISPATCH_BUDGET asks: the
        sends woken by this turn's answers run (and write) first."""
        self._deferred = rest
        self._pause_reading(True)
        self._loop.call_soon(self._take_deferred)

    def _take_deferred(self) -> None:
        rest, self._deferred = self._deferred, b""
        self.data_received(rest)
        if not (self._deferred or self._backlog):
            self._pause_reading(False)

    def _dispatch(self, commands: Sequence[RemotingCommand | SendFrame | RawAnswer]) -> None:
        """Dispatch commands that arrived together, then what they asked to run after."""
        self._end_of_dispatch = []
        try:
            dispatcher = self._dispatcher
            many = dispatcher.plain_sends if dispatcher is not None else None
            if many is None or dispatcher is None or dispatcher.guard is not None:
                for cmd in commands:
                    self._on_command(cmd)
            else:
                self._dispatch_runs(commands, many)
        finally:
            self._run_end_of_dispatch()

    def _dispatch_runs(self, commands: Sequence[RemotingCommand | SendFrame | RawAnswer],
                       many: PlainSendsHandler) -> None:
        """:meth:`_dispatch` with each run of back-to-back plain sends in one call of the
        dispatcher's run handler; the send it does not take goes the ordinary way."""
        i, n = 0, len(commands)
        while i < n:
            if type(commands[i]) is not tuple:
                self._on_command(commands[i])
                i += 1
                continue
            j = i + 1
            while j < n and type(commands[j]) is tuple:
                j += 1
            run = cast("list[SendFrame]", commands[i:j])
            self._immediate += len(run)
            try:
                taken = many(run, self)
            except Exception:  # unknown which were stored: the client retries elsewhere
                log.exception("plain sends handler failed on %s; closing it", self.name)
                self._immediate -= len(run)
                self._mark_closed("plain sends handler failed")
                return
            self._immediate -= len(run) - taken
            i += taken
            if i < j:  # the one it left, the ordinary way (refusals are answered there)
                self._on_command(command_of(run[taken]))
                i += 1

    def _dispatch_some(self) -> None:
        """The next DISPATCH_BUDGET commands of the backlog; the rest in a later turn, with
        reading paused until the backlog is gone (it never holds more than one read)."""
        self._drain_scheduled = False
        backlog = self._backlog
        if self._closed.done():
            backlog.clear()
            return
        chunk = [backlog.popleft() for _ in range(min(DISPATCH_BUDGET, len(backlog)))]
        if backlog:
            self._drain_scheduled = True
            self._loop.call_soon(self._dispatch_some)
            self._pause_reading(True)
        else:
            self._pause_reading(False)
        self._dispatch(chunk)

    def _pause_reading(self, pause: bool) -> None:
        if pause == self._reading_paused or self._transport is None:
            return
        self._reading_paused = pause
        try:
            if pause:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()
        except (RuntimeError, AttributeError):  # closing, or a transport that cannot
            pass

    def at_end_of_dispatch(self, cb: Callable[[], None]) -> None:
        """Run ``cb()`` once the commands dispatched with the one being handled have all
        been dispatched (an immediate handler runs inside that dispatch): what requests
        arriving together share, such as one wait for their replicas, is done once for
        all of them.  Commands arrive together when one read brought them, at most
        ``DISPATCH_BUDGET`` of them.  Outside a dispatch it runs at once."""
        if self._end_of_dispatch is None:
            cb()
        else:
            self._end_of_dispatch.append(cb)

    def _run_end_of_dispatch(self) -> None:
        callbacks, self._end_of_dispatch = self._end_of_dispatch, None
        for cb in callbacks or ():
            try:
                cb()
            except Exception:  # one broken callback must not keep the others from running
                log.exception("end-of-dispatch callback of %s failed", self.name)

    def eof_received(self) -> bool:
        self._mark_closed("peer closed")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._mark_closed("peer closed" if exc is None else f"read failed: {exc}")
        if not self._lost.done():
            self._lost.set_result(None)
        self._wake_drain_waiters()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain_waiters()

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _check_stall(self) -> None:
        """Drop a peer stalled inside a frame; one timer per stall, moved on by new data."""
        self._stall_timer = None
        if self._closed.done() or not self._decoder.buffered or self._frame_read_timeout is None:
            return
        due = self._last_data + self._frame_read_timeout
        if self._loop.time() < due:
            self._stall_timer = self._loop.call_at(due, self._check_stall)
            return
        reason = (f"stalled inside a frame: {self._decoder.buffered} bytes of it "
                  f"received, nothing more for {self._frame_read_timeout:g}s")
        log.warning("closing connection %s: %s", self.name, reason)
        self._mark_closed(reason)

    # --- the connection ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.done()

    def use_layer(self, layer: FrameLayer) -> None:
        """Decode and seal through ``layer`` from now on (before any frame went either way)."""
        self._decoder = layer
        self._feed = layer.feed
        self._seal = layer.seal
        layer.raw_answers = self._raw_opaques

    def drop_layer(self, data: bytes) -> Sequence[RemotingCommand | SendFrame | RawAnswer]:
        """Back to the plain decoder (a layer that found its peer plain, before any frame
        went either way), which decodes ``data``: the bytes the layer held.  The
        connection then costs what one that never had a layer does."""
        self._decoder, self._feed, self._seal = self._plain_decoder, self._plain_feed, None
        return self._feed(data)

    def write_raw(self, data: bytes) -> None:
        """Write bytes outside any frame (a frame layer's handshake)."""
        self._write(data)

    @property
    def in_flight(self) -> int:
        """Requests from the peer being handled now (this one included, in a handler)."""
        return len(self._tasks) + self._immediate

    def require_peer(self, *, roles: Collection[Role] | None = None,
                     expected: Identity | None = None, cluster: str | None = None,
                     group: str | None = None) -> Identity:
        """The peer's certificate identity if it passes
        :func:`~rmqha.security.identity.authorize`; otherwise RemoteCommandError
        NO_PERMISSION naming why (a handler raising it answers the request with it)."""
        try:
            if self.peer_identity is None:
                raise PeerIdentityError(f"connection {self.name} has no verified certificate "
                                        "naming an rmqha identity")
            return authorize(self.peer_identity, roles=roles, expected=expected,
                             cluster=cluster, group=group)
        except PeerIdentityError as exc:
            raise RemoteCommandError(ResponseCode.NO_PERMISSION, str(exc)) from None

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def add_close_callback(self, cb: Callable[[Connection], None]) -> None:
        """cb(connection) runs once when the connection closes (at once if already closed)."""
        if self.closed:
            cb(self)
        else:
            self._close_callbacks.append(cb)

    async def send(self, cmd: RemotingCommand) -> None:
        self._queue_frame(cmd, len(self._tasks) + self._immediate > 1)
        # Wait for the kernel only while the transport is paused (its buffer is past our
        # high-water mark), not after every frame.
        if self._write_paused:
            await self.drained()

    @property
    def write_paused(self) -> bool:
        """Whether the transport's buffer is past our high-water mark (see drained())."""
        return self._write_paused

    async def drained(self) -> None:
        """Wait until the transport takes more (RemotingError if the connection closes)."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(fut)
        await fut
        if self.closed:
            raise RemotingError(f"connection {self.name} closed while sending ({self.close_reason})")

    def _queue_frame(self, cmd: RemotingCommand, others: bool) -> None:
        """Queue one frame whole (frames never interleave, so no lock): at once, or with the
        other frames of this loop turn when ``others`` (more answers in flight here) or
        more requests of ours are pending: one syscall and one wake-up of the peer for all
        of them, instead of one per frame."""
        if self.closed:
            raise RemotingError(f"connection {self.name} is closed ({self.close_reason})")
        self._queue_bytes(encode(cmd), others)

    def _queue_bytes(self, data: bytes, others: bool) -> None:
        if self._seal is not None:
            data = self._seal(data)  # here, in the order frames reach the wire
        if self._cork is not None:
            self._cork.append(data)
        elif others or len(self._pending) + len(self._raw) + len(self._sends) > 1:
            self._cork = [data]
            self._loop.call_soon(self._uncork)
        else:
            self._write(data)

    def answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        """Answer a request an immediate handler took (see :class:`Dispatcher`); never
        waits: what the transport cannot take yet stays in its buffer."""
        self._immediate -= 1
        if request.is_oneway or self.closed:
            return
        self._stamp(request, response)
        try:
            self._queue_frame(response, len(self._tasks) + self._immediate > 0)
        except RemotingError as exc:
            log.debug("could not answer %s: %s", request.describe(), exc)

    def answer_frame(self, data: bytes) -> None:
        """:meth:`answer` with the answer's frame encoded already (a plain send's)."""
        self._immediate -= 1
        if self._closed.done():
            return
        try:
            self._queue_bytes(data, len(self._tasks) + self._immediate > 0)
        except RemotingError as exc:
            log.debug("could not answer a send: %s", exc)

    def answer_frames(self, frames: list[bytes]) -> None:
        """:meth:`answer_frame` for the answers one ack released, in their order: queued
        as one chunk (one write with what else this turn answers), not one per send."""
        if frames:
            self.answer_chunk(frames[0] if len(frames) == 1 else b"".join(frames), len(frames))

    def answer_chunk(self, data: bytes, count: int) -> None:
        """:meth:`answer_frames` for ``count`` answer frames already joined into one bytes
        (a run of plain sends' answers, encoded in one call)."""
        self._immediate -= count
        if self._closed.done() or not data:
            return
        try:
            if self._seal is not None:  # the frame layer seals frame by frame
                pos, n = 0, len(data)
                while pos < n:
                    end = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
                    self._queue_bytes(data[pos:end], True)
                    pos = end
            elif self._cork is not None:
                self._cork.append(data)
            else:
                self._queue_bytes(data, len(self._tasks) + self._immediate > 0)
        except RemotingError as exc:
            log.debug("could not answer %d sends: %s", count, exc)

    @staticmethod
    def _stamp(request: RemotingCommand, response: RemotingCommand) -> None:
        response.opaque = request.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = request.serialize_type  # answer in the type asked in

    def _write(self, data: bytes) -> None:
        assert self._transport is not None
        try:
            self._transport.write(data)
        except (ConnectionError, OSError, RuntimeError) as exc:
            self._mark_closed(f"write failed: {exc}")
            raise RemotingError(f"connection {self.name}: write failed: {exc}") from exc

    def _uncork(self) -> None:
        chunks, self._cork = self._cork, None
        if not chunks or self.closed:
            return
        try:
            self._write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except RemotingError as exc:
            # The senders returned already; the close fails what still waits on this link.
            log.debug("%s", exc)

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for the response with the same opaque."""
        if cmd.is_oneway or cmd.is_response:
            raise ValueError("request() needs a two-way request command")
        opaque = cmd.opaque
        fut = self._awaiting(self._pending, opaque, timeout)
        try:
            await self.send(cmd)
            return await fut
        except _Expired:
            raise RemotingTimeoutError(
                f"no response from {self.name} to {cmd.describe()} within {timeout:.3f}s"
            ) from None
        finally:
            self._settle(self._pending, opaque, fut)

    async def request_frame(self, frame: bytes, opaque: int, timeout: float) -> bytes:
        """:meth:`request` of a two-way request encoded already (its opaque is ``opaque``;
        ``frame`` with its length field, as :func:`~rmqha.protocol.command.encode` writes
        it): the response's frame comes back undecoded, without its length field.  It
        goes through the frame layer's seal like any frame; no request hook sees it."""
        if self._closed.done():
            raise RemotingError(f"connection {self.name} is closed ({self.close_reason})")
        fut = self._awaiting(self._raw, opaque, timeout)
        try:
            self._queue_bytes(frame, len(self._tasks) + self._immediate > 1)
            if self._write_paused:
                await self.drained()
            return await fut
        except _Expired:
            raise RemotingTimeoutError(
                f"no response from {self.name} to the request with opaque {opaque} "
                f"within {timeout:.3f}s") from None
        finally:
            self._settle(self._raw, opaque, fut)

    def send_frame(self, frame: bytes, opaque: int, timeout: float) -> asyncio.Future[Any]:
        """Send a two-way request encoded already (a producer's send; its opaque is
        ``opaque``, ``frame`` with its length field) and return the future of its answer:
        the send codec's fields of it (``decode_send_answer``'s ``Answer``) when a read brings
        it whole where the codec reads it, else its frame undecoded (bytes, without its
        length field); RemotingTimeoutError after ``timeout``, RemotingError when the
        connection closes.  No coroutine: the caller waits for the transport
        (:attr:`write_paused`, :meth:`drained`) and calls :meth:`forget` if it stops
        waiting.  The frame goes through the frame layer's seal; no request hook sees it."""
        if self._closed.done():
            raise RemotingError(f"connection {self.name} is closed ({self.close_reason})")
        loop = self._loop
        fut = loop.create_future()
        deadline = loop.time() + timeout
        self._sends[opaque] = fut
        self._deadlines[opaque] = deadline
        if self._timer is None or deadline < self._timer_at:
            self._arm_timer(deadline)
        try:
            self._queue_bytes(frame, len(self._tasks) + self._immediate > 1)
        except RemotingError:
            self.forget(opaque)
            if fut.done():
                fut.exception()  # the close failed it; the caller gets this error instead
            raise
        return fut

    def forget(self, opaque: int) -> None:
        """Stop waiting for the answer to the send with ``opaque`` (its caller gave up)."""
        self._sends.pop(opaque, None)
        self._deadlines.pop(opaque, None)

    def _awaiting(self, pending: dict[int, asyncio.Future[_T]], opaque: int,
                  timeout: float) -> asyncio.Future[_T]:
        """A future for the response to ``opaque``, failed with _Expired after ``timeout``."""
        fut: asyncio.Future[_T] = self._loop.create_future()
        deadline = self._loop.time() + timeout
        pending[opaque] = fut
        self._deadlines[opaque] = deadline
        # One timer per connection, at the earliest deadline (not one per request: with
        # hundreds in flight their heap operations cost more than the requests).
        if self._timer is None or deadline < self._timer_at:
            self._arm_timer(deadline)
        return fut

    def _settle(self, pending: dict[int, asyncio.Future[_T]], opaque: int,
                fut: asyncio.Future[_T]) -> None:
        pending.pop(opaque, None)
        self._deadlines.pop(opaque, None)
        if fut.done() and not fut.cancelled():
            # A failed send closes the connection, which fails this future too; the
            # send's own error is what was raised, so mark this one as seen.
            fut.exception()

    def _arm_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._expire_due)

    def _expire_due(self) -> None:
        """Fail every request past its deadline; re-arm for the next one."""
        self._timer = None
        now = self._loop.time()
        earliest: float | None = None
        due: list[int] = []
        for opaque, deadline in self._deadlines.items():
            if deadline <= now:
                due.append(opaque)
            elif earliest is None or deadline < earliest:
                earliest = deadline
        for opaque in due:
            self._expire(opaque)
        if earliest is not None:
            self._arm_timer(earliest)

    def _expire(self, opaque: int) -> None:
        send = self._sends.pop(opaque, None)
        if send is not None:  # nobody settles a send: its table entries go here
            del self._deadlines[opaque]
            if not send.done():
                send.set_exception(RemotingTimeoutError(
                    f"no response from {self.name} to the send with opaque {opaque} in time"))
            return
        fut = self._pending.get(opaque) or self._raw.get(opaque)
        if fut is not None:
            _expire(fut)

    async def oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= FLAG_ONEWAY
        await self.send(cmd)

    async def close(self, reason: str = "closed locally", timeout: float = 5.0) -> None:
        self._uncork()  # what was sent goes out before the close
        self._mark_closed(reason)
        try:
            await asyncio.wait_for(asyncio.shield(self._lost), timeout)
        except asyncio.TimeoutError:
            # A graceful close waits for queued bytes to leave, and a peer that reads
            # nothing would hold the caller (a producer closing a timed-out link) forever.
            if self._transport is not None:
                self._transport.abort()

    def drop(self, reason: str) -> None:
        """Close now, without waiting for what is queued to leave."""
        self._mark_closed(reason)

    def _mark_closed(self, reason: str) -> None:
        if self._closed.done():
            return
        self.close_reason = reason
        self._closed.set_result(None)
        if self._transport is not None:
            self._transport.close()
        elif not self._lost.done():
            self._lost.set_result(None)
        futures: list[asyncio.Future[Any]] = [*self._pending.values(), *self._raw.values(),
                                              *self._sends.values()]
        for fut in futures:
            if not fut.done():
                fut.set_exception(RemotingError(f"connection {self.name} closed: {reason}"))
        self._pending.clear()
        self._raw.clear()
        self._sends.clear()
        self._deadlines.clear()
        self._deferred = b""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # a broken callback must not stop the others
                log.exception("close callback of %s failed", self.name)

    def _on_command(self, cmd: RemotingCommand | SendFrame | RawAnswer, admitted: bool = False) -> None:
        if isinstance(cmd, RawAnswer):
            raw = self._raw.get(cmd.opaque)
            if raw is None:
                raw = self._sends.pop(cmd.opaque, None)
                self._deadlines.pop(cmd.opaque, None)
            if raw is not None and not raw.done():
                raw.set_result(cmd.frame)
            else:
                log.debug("%s: dropping response with unknown opaque %d", self.name, cmd.opaque)
            return
        if isinstance(cmd, tuple):
            self._on_plain_send(cmd)
            return
        if cmd.is_response:
            fut = self._pending.get(cmd.opaque)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            else:
                log.debug("%s: dropping response with unknown opaque %d", self.name, cmd.opaque)
            return
        if self._dispatcher is not None:
            guard = self._dispatcher.guard
            if guard is not None and not admitted and not self._admitted(guard, cmd):
                return
            now = self._dispatcher.immediate.get(cmd.code)
            if now is not None and self._take_now(now, cmd):
                return
        task = self._loop.create_task(self._handle(cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_plain_send(self, send: SendFrame) -> None:
        """A plain send to its handler, or (not taken, or a guard whose plain check does
        not admit it) the ordinary way, in its place; one the plain check admitted is not
        checked again (its check counts once: the ACL's replay window remembers it)."""
        dispatcher = self._dispatcher
        handler = dispatcher.plain_send if dispatcher is not None else None
        admitted = bool(handler is not None and dispatcher is not None and dispatcher.guard is not None
                        and dispatcher.plain_guard is not None and dispatcher.plain_guard(send, self))
        if handler is not None and dispatcher is not None and (dispatcher.guard is None or admitted):
            self._immediate += 1
            try:
                if handler(send, self):
                    return
            except Exception as exc:  # a handler bug answers SYSTEM_ERROR, never kills the link
                cmd = command_of(send)
                log.exception("plain send handler for %s from %s failed", cmd.describe(), self.name)
                self.answer(cmd, cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"))
                return
            self._immediate -= 1
        self._on_command(command_of(send), admitted)

    def _admitted(self, guard: Guard, cmd: RemotingCommand) -> bool:
        """Whether ``guard`` lets ``cmd`` through; a refusal is answered here."""
        try:
            guard(cmd, self)
        except RemoteCommandError as exc:
            log.info("refused %s from %s: %s", cmd.describe(), self.name, exc.remark)
            self._immediate += 1  # answered like a request an immediate handler took
            self.answer(cmd, cmd.response(exc.code, exc.remark))
            return False
        return True

    def _take_now(self, handler: ImmediateHandler, cmd: RemotingCommand) -> bool:
        self._immediate += 1
        try:
            taken = handler(cmd, self)
        except RemoteCommandError as exc:
            self.answer(cmd, cmd.response(exc.code, exc.remark))
            return True
        except Exception as exc:  # a handler bug answers SYSTEM_ERROR, never kills the link
            log.exception("immediate handler for %s from %s failed", cmd.describe(), self.name)
            self.answer(cmd, cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"))
            return True
        if not taken:
            self._immediate -= 1
        return taken

    async def _handle(self, cmd: RemotingCommand) -> None:
        if self._dispatcher is None:
            response: RemotingCommand | None = not_supported(cmd)
        else:
            try:
                response = await self._dispatcher(cmd, self)
            except RemoteCommandError as exc:
                response = cmd.response(exc.code, exc.remark)
            except RmqhaError as exc:
                response = cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a handler bug answers SYSTEM_ERROR, never kills the link
                log.exception("handler for %s from %s failed", cmd.describe(), self.name)
                response = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if cmd.is_oneway or response is None or self.closed:
            return
        self._stamp(cmd, response)
        try:
            await self.send(response)
        except RemotingError as exc:
            log.debug("could not answer %s: %s", cmd.describe(), exc)

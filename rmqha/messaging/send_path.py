"""The send path: SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE.

A send is checked (admitted by the verdict: master, its lease, enough in-sync replicas; a
writable topic, created on first use when allowed, of the topic's ``message.type`` when it
declares one), appended through the :class:`~rmqha.messaging.log_writer.LogWriter` and
answered once its copies and flush are known.  Four ways in, one answer rule:

* :meth:`SendPath.on_send`: the task handler (a coroutine per send), for a master still
  waiting for its first lease and for whatever the others leave;
* :meth:`SendPath.on_send_now`: the immediate handler, a decoded command in the loop turn
  that read it, stored into the connection's :class:`_SendGroup`;
* :meth:`SendPath.on_plain_send`: a plain send straight from its frame's fields
  (``send_frames.scan``), no command or header object, into the same group;
* :meth:`SendPath.on_plain_sends`: a run of plain sends, appended in one call
  (``CommitLog.append_plain_run``) as one :class:`_RunAnswer`.

Whatever the way in, the answer is :func:`rmqha.messaging.verdict.verdict` of facts: the
refusal before writing (``MessagingContext.check_writable``, once per group) and the
status after (``LogWriter.when_durable`` / ``await_durable``: the copies the HA master's
waiter reports, the group commit, the lease); a group waits once, for its last send, and
when that fell short each earlier send is judged again with its own copies
(``LogWriter.answer_now``).  A group's SUCCESS answers are encoded in one call each
(``send_frames.encode_send_ok``; a run's in one, ``encode_send_oks``).  An idempotent send
never takes a plain lane: a retry is answered from :mod:`~rmqha.messaging.producer_state`.
"""
from __future__ import annotations

import logging
import random
import time
from array import array
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

from rmqha import _core
from rmqha.net.dispatcher import LanePeer
from rmqha.net.peer import RequestPeer
from rmqha._core._protocols import SendFrame
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import (
    ConfigError,
    DiskFullError,
    InvalidMessageError,
    ProtocolError,
    StoreError,
)
from rmqha.messaging.context import (
    MAX_INFLATED_BATCH_BYTES,
    PUT_STATUS_FIELD,
    Handler,
    MessagingContext,
    Refused,
)
from rmqha.messaging.delayed_delivery import (
    DelayedDelivery,
    asks_for_delay,
)
from rmqha.protocol.headers import SendHeader
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.producer_state import ProducerTable, claim_in
from rmqha.messaging.send_answer import send_answer
from rmqha.protocol.idempotence import PRODUCER_ID, Claim
from rmqha.protocol.message import (
    DecompressError,
    SysFlag,
    decode_batch,
    decode_properties,
    decompress,
    offset_msg_id,
    strip_compression,
)
from rmqha.messaging.topic_admin import TopicAdmin
from rmqha.protocol.topic_attributes import (
    TopicMessageType,
    topic_message_type,
)
from rmqha.protocol.topics import PERM_WRITE, validate_topic_name
from rmqha.messaging.transactions import (
    COMMITTED_MARK,
    Transactions,
    transaction_type,
)
from rmqha.protocol.command import VERSION, RemotingCommand
from rmqha.messaging.send_rules import (
    INTERNAL_TOPICS,
    MAX_BATCH_ITEMS,
    PLAIN_SEND_REFUSE,
    RESERVED_KEYS,
    RESERVED_PREFIXES,
    check_type,
    send_asks_for_delay,
    without_mark,
)

log = logging.getLogger(__name__)
_records = _core.load("records")
_send_frames = _core.load("send_frames")
@dataclass(slots=True)
class _Send:
    """A checked send: what to append where, and the queue its answer names."""

    topic: str
    queue_id: int
    #: A diverted message (half, delayed) answers with the queue it was sent to.
    reply_queue_id: int
    rows: list[tuple[bytes, str | dict[str, str], int, int]]
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    #: A batch body whose ``batch_count`` entries are stored as they came (``rows`` empty).
    batch: bytes | memoryview | None = None
    batch_count: int = 0
    #: An idempotent producer's claim (:mod:`rmqha.messaging.producer_state`).
    claim: Claim | None = None


#: The connection attribute holding its peer as a born host.
_BORN_HOST = "send_path.born_host"


def _request_of(send: SendFrame) -> RemotingCommand:
    """A stand-in for a plain send's request, enough to answer it (code, opaque, serialize
    type: all an answer takes from its request)."""
    return RemotingCommand(send[0], opaque=send[1], serialize_type=send[2])


@dataclass(slots=True)
class _Answer:
    """A send stored by :meth:`SendPath.on_send_now` (``cmd``) or
    :meth:`SendPath.on_plain_send` (``plain``, its frame's fields) and not answered yet."""

    cmd: RemotingCommand | None
    reply_queue_id: int
    placed: list[tuple[int, int]]
    started: float
    plain: SendFrame | None = None
    #: A plain send's queue offset as its append gave it (-1: read from its record).
    queue_offset: int = -1

    def end(self) -> int:
        off, size = self.placed[-1]
        return off + size


@dataclass(slots=True)
class _RunAnswer:
    """Plain sends ``sends[start:stop]`` stored by one :meth:`SendPath._take_run` and not
    answered yet: what each got, in arrays indexed like ``sends`` (no object per send)."""

    sends: list[SendFrame]
    start: int
    stop: int
    queue_ids: array[int]
    offsets: array[int]
    sizes: array[int]
    queue_offsets: array[int]
    started: float

    def end(self) -> int:
        last = self.stop - 1
        return self.offsets[last] + self.sizes[last]

    def each(self) -> list[_Answer]:
        """One :class:`_Answer` per send (for what is answered send by send)."""
        return [_Answer(None, self.queue_ids[i], [(self.offsets[i], self.sizes[i])],
                        self.started, self.sends[i], self.queue_offsets[i])
                for i in range(self.start, self.stop)]


class _SendGroup:
    """The sends a connection dispatched together (one read's, at most the remoting
    DISPATCH_BUDGET of them), stored as they are dispatched: they wait for
    their replicas (and the group commit) as one, for the end of the last, and are
    answered together.  One waiter instead of one per send, and the checks every send of
    the group would repeat (writable, the topic's config) done once per group."""

    __slots__ = ("conn", "answers", "topics", "plain_topics", "writable", "born_host")

    def __init__(self, conn: LanePeer, born_host: tuple[str, int]) -> None:
        self.conn = conn
        self.born_host = born_host
        self.answers: list[_Answer | _RunAnswer] = []
        #: Topic -> its config, once a send to it passed the topic checks in this group.
        self.topics: dict[str, Any] = {}
        #: The same for plain sends: topics that exist and declare no message type.
        self.plain_topics: dict[str, Any] = {}
        self.writable = False


class SendPath:
    """Stores what producers send."""

    def __init__(self, ctx: MessagingContext, writer: LogWriter, topics: TopicAdmin,
                 delayed: DelayedDelivery, transactions: Transactions) -> None:
        self.ctx = ctx
        self.writer = writer
        self.topic_admin = topics
        self.delayed = delayed
        self.transactions = transactions
        # offsetMsgId = hex(store ip, port) + hex(commitlog offset): the host part once.
        self._msg_id_prefix = offset_msg_id(ctx.config.broker_address, 0)[:16]
        #: Put status -> its child of the send latency histogram.
        self._latency: dict[str, Any] = {}
        #: The sends being dispatched (see _SendGroup), None between dispatches.
        self._group: _SendGroup | None = None
        #: Topic names a plain send may use (valid, not internal): checked once each.
        self._plain_names: set[str] = set()
        #: What idempotent producers stored: a retry is answered, not stored again.
        self.producers = ProducerTable(int(ctx.config.idempotent_max_producer_queues))

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {
            rc.SEND_MESSAGE: self.on_send,
            rc.SEND_MESSAGE_V2: self.on_send,
            rc.SEND_BATCH_MESSAGE: self.on_send,
        }

    def immediate_handlers(self) -> dict[int, Any]:
        """The same codes without a task (see :meth:`on_send_now`)."""
        return {code: self.on_send_now for code in self.handlers()}

    def plain_send_handler(self) -> tuple[Any, tuple[bytes, ...]]:
        """The handler of plain sends parsed from their frames and what their properties
        must not hold (:meth:`rmqha.net.dispatcher.Dispatcher.register_plain_send`)."""
        return self.on_plain_send, PLAIN_SEND_REFUSE

    async def on_send(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        started = time.perf_counter()
        try:
            resp = await self._send(cmd, conn)
        except Refused as r:
            resp = cmd.response(r.code, r.remark, r.ext)
        self._observe(resp, started)
        return resp

    def on_send_now(self, cmd: RemotingCommand, conn: LanePeer) -> bool:
        """The send without a task (the remoting connection's immediate handler): checks,
        append and push in the turn that decoded the request, and the answer from the ack
        callback that completes it, with no coroutine and no task step in between.  The
        sends dispatched together share that wait (see :class:`_SendGroup`).  False leaves the
        request to :meth:`on_send`: a master still waiting for its first lease."""
        group = self._group
        opened = group is None or group.conn is not conn
        if opened:
            group = self._open_group(conn)
            if group is None:
                return False
        assert group is not None
        started = time.perf_counter()
        try:
            send = self._prepare(cmd, conn, group)
            if send.claim is not None and self._answered_again(send, cmd, conn, started):
                return True
            placed = self._store(send, conn, grouped=True)
        except Refused as r:
            resp = cmd.response(r.code, r.remark, r.ext)
            self._observe(resp, started)
            conn.answer(cmd, resp)
        else:
            group.answers.append(_Answer(cmd, send.reply_queue_id, placed, started))
        finally:
            if opened:
                # After the first send is in (outside a dispatch, a direct call, this closes
                # at once), and even when it failed: a group left open would hold the
                # connection's later sends.
                conn.at_end_of_dispatch(partial(self._close_group, group))
        return True

    def _open_group(self, conn: LanePeer) -> _SendGroup | None:
        """A new group for ``conn``'s sends of this dispatch; None for a master still
        waiting for its first lease (its sends go to the task-based handler)."""
        replication = self.ctx.replication
        if replication is not None and replication.awaiting_first_lease():
            return None
        # A connection's peer never changes: its born host is parsed once.
        attributes = getattr(conn, "attributes", None)
        host = attributes.get(_BORN_HOST) if attributes is not None else None
        if host is None:
            host = self.ctx.born_host(conn)
            if attributes is not None:
                attributes[_BORN_HOST] = host
        group = self._group = _SendGroup(conn, host)
        # The group's appends queue no wake: _close_group pushes them in this turn.
        if replication is not None:
            replication.defer_push()
        return group

    def on_plain_send(self, send: SendFrame, conn: LanePeer) -> bool:
        """A plain send straight from its frame's fields (see
        :mod:`rmqha._core.send_frames`): :meth:`on_send_now` without a command, a header
        object or a row, in the same group as the sends dispatched with it, answered with
        a frame encoded in one call.  False leaves it to the ordinary way (which makes the
        same checks and answers any refusal): anything a check does not pass, a topic that
        does not exist yet or declares a message type, and whatever on_send_now leaves."""
        group, opened = self._group_of(conn)
        if group is None:
            return False
        try:
            return self._take_plain(send, conn, group)
        finally:
            if opened:
                conn.at_end_of_dispatch(partial(self._close_group, group))

    def _group_of(self, conn: LanePeer) -> tuple[_SendGroup | None, bool]:
        """The open group of ``conn``'s dispatch, or a new one (None when none can be
        opened), and whether it was opened here (its opener closes it)."""
        group = self._group
        if group is not None and group.conn is conn:
            return group, False
        return self._open_group(conn), True

    def on_plain_sends(self, sends: Sequence[SendFrame], conn: LanePeer) -> int:
        """:meth:`on_plain_send` for a run of plain sends that arrived together, in one
        call (:meth:`rmqha.net.dispatcher.Dispatcher.register_plain_sends`): how many,
        from the first, it took; the next is left to the ordinary way.  A failure of
        its own on one send answers that send SYSTEM_ERROR, as the connection would."""
        group, opened = self._group_of(conn)
        if group is None:
            return 0
        run = sends if type(sends) is list else list(sends)
        taken, n = 0, len(run)
        try:
            while taken < n:
                taken += self._take_run(run, taken, conn, group)
                if taken == n or not self._take_one(run[taken], conn, group):
                    break
                taken += 1
        finally:
            if opened:
                conn.at_end_of_dispatch(partial(self._close_group, group))
        return taken

    def _take_run(self, sends: list[SendFrame], start: int, conn: LanePeer,
                  group: _SendGroup) -> int:
        """From ``start``, the plain sends :meth:`_take_plain` would store one by one,
        appended in one call (``LogWriter.append_plain_run``) and answered as one
        (:class:`_RunAnswer`): how many.  It ends before the first it cannot take so (a
        batch, a topic no plain send may use as it is, a send the append leaves alone),
        which goes one by one."""
        started = time.perf_counter() if self.ctx.metrics is not None else 0.0
        if not group.writable:
            try:
                self.ctx.check_writable()
            except Refused:
                return 0
            group.writable = True
        try:
            qids, stop = self._run_queues(sends, start, group)
        except Exception:  # a bug here: the send goes one by one, which answers it
            log.exception("plain sends from %s: run not taken", getattr(conn, "name", conn))
            return 0
        if stop == start:
            return 0
        n = len(sends)
        offsets, sizes = array("q", bytes(8 * n)), array("i", bytes(4 * n))
        queue_offsets = array("q", bytes(8 * n))
        try:
            taken = self.writer.append_plain_run(sends, start, stop, qids,
                                                 int(time.time() * 1000), group.born_host,
                                                 offsets, sizes, queue_offsets)
        except StoreError:
            return 0  # nothing stored (a closed log): one by one meets it and answers it
        if taken:
            group.answers.append(_RunAnswer(sends, start, start + taken, qids, offsets,
                                            sizes, queue_offsets, started))
            m = self.ctx.metrics
            if m is not None:
                m.messages_stored.inc(taken)
                m.bytes_stored.inc(sum(sizes[start:start + taken]))
        return taken

    def _run_queues(self, sends: list[SendFrame], start: int,
                    group: _SendGroup) -> tuple[array[int], int]:
        """Each send's queue id, as :meth:`_take_plain` picks it, from ``start`` up to the
        first that is not a plain single send to a topic a plain send may use: (queue ids
        indexed like ``sends``, where they end)."""
        n = len(sends)
        qids = array("i", bytes(4 * n))
        plain_topics = group.plain_topics
        batch = RequestCode.SEND_BATCH_MESSAGE
        stop = start
        while stop < n:
            send = sends[stop]
            if send[0] == batch:
                break
            topic = send[3]
            cfg = plain_topics.get(topic)
            if cfg is None:
                cfg = group.topics.get(topic) or self._plain_topic(topic)
                if cfg is None or self._expected_type(cfg) is not None:
                    break
                plain_topics[topic] = cfg
            nq = cfg.write_queue_nums
            q = send[4]
            qids[stop] = (random.randrange(nq) if q < 0 else q) % nq
            stop += 1
        return qids, stop

    def _take_one(self, send: SendFrame, conn: LanePeer, group: _SendGroup) -> bool:
        try:
            return self._take_plain(send, conn, group)
        except Exception as exc:  # a bug here answers SYSTEM_ERROR, never loses the link
            log.exception("plain send from %s failed", getattr(conn, "name", conn))
            self._refuse_plain(send, conn, ResponseCode.SYSTEM_ERROR,
                               f"{type(exc).__name__}: {exc}", time.perf_counter())
            return True

    def _take_plain(self, send: SendFrame, conn: LanePeer, group: _SendGroup) -> bool:
        started = time.perf_counter() if self.ctx.metrics is not None else 0.0
        topic = send[3]
        if not group.writable:
            try:
                self.ctx.check_writable()
            except Refused:
                return False
            group.writable = True
        cfg = group.plain_topics.get(topic)
        if cfg is None:
            cfg = group.topics.get(topic) or self._plain_topic(topic)
            if cfg is None or self._expected_type(cfg) is not None:
                return False
            group.plain_topics[topic] = cfg
        queue_id = send[4]
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)
        queue_id %= cfg.write_queue_nums
        born = send[6] or int(time.time() * 1000)
        if send[0] == RequestCode.SEND_BATCH_MESSAGE:
            return self._take_plain_batch(send, conn, group, queue_id, born, started)
        try:
            offset, size, queue_offset = self.writer.append_plain_now(
                topic, queue_id, send[10], send[8], send[7], send[5], born, group.born_host,
                send[9])
        except (StoreError, InvalidMessageError):
            return False  # nothing stored: the ordinary way meets it again and answers it
        rows = [(offset, size)]
        if self.ctx.metrics is not None:
            self._count(rows)
        group.answers.append(_Answer(None, queue_id, rows, started, send, queue_offset))
        return True

    def _take_plain_batch(self, send: SendFrame, conn: LanePeer, group: _SendGroup, queue_id: int,
                          born: int, started: float) -> bool:
        """A SEND_BATCH_MESSAGE whose entries are all stored as they came (``batch_plain``),
        as :meth:`_prepare` and :meth:`_store` do it."""
        body = send[10]
        count = _records.batch_plain(body, MAX_BATCH_ITEMS, RESERVED_KEYS, RESERVED_PREFIXES)
        if count <= 0:
            return False
        try:
            placed = self.writer.append_batch_now(send[3], queue_id, body, count, send[5], born,
                                                  group.born_host)
        except DiskFullError as exc:
            # Entries before it may be stored: answered here, as _store refuses it.
            self._refuse_plain(send, conn, ResponseCode.SERVICE_NOT_AVAILABLE, str(exc), started)
            return True
        except StoreError as exc:
            self._refuse_plain(send, conn, ResponseCode.MESSAGE_ILLEGAL, str(exc), started)
            return True
        if self.ctx.metrics is not None:
            self._count(placed)
        group.answers.append(_Answer(None, queue_id, placed, started, send))
        return True

    def _refuse_plain(self, send: SendFrame, conn: LanePeer, code: int, remark: str,
                      started: float) -> None:
        cmd = _request_of(send)
        resp = cmd.response(code, remark)
        self._observe(resp, started)
        conn.answer(cmd, resp)

    def _plain_topic(self, topic: str) -> Any:
        """The config of an existing topic a plain send may go to as it is (no refusal
        to answer, nothing to create), else None."""
        if topic not in self._plain_names:
            try:
                validate_topic_name(topic)
            except ConfigError:
                return None
            if topic in INTERNAL_TOPICS:
                return None
            if len(self._plain_names) >= 4096:
                self._plain_names.clear()
            self._plain_names.add(topic)
        cfg = self.ctx.topics.get(topic)
        if cfg is None or not cfg.perm & PERM_WRITE:
            return None
        return cfg

    def _close_group(self, group: _SendGroup) -> None:
        """The group's sends are all stored: push them and wait for the end of the last."""
        if self._group is group:
            self._group = None
        ctx = self.ctx
        if ctx.replication is not None:
            # Now, not at the turn's end: the answer waits on it.  Even for a group with
            # nothing to answer: it ends _open_group's defer_push.
            ctx.replication.push_now()
        if not group.answers:
            return
        end = group.answers[-1].end()
        conn = group.conn
        answers = group.answers

        def durable(code: int, status: str) -> None:
            if code == ResponseCode.SUCCESS and ctx.metrics is None:
                self._answer_ok(conn, answers, status)
                return
            short = code == ResponseCode.FLUSH_SLAVE_TIMEOUT
            for a in self._each(answers):
                c, st = code, status
                if short:
                    # The group's end fell short; an earlier send of it may be held: the
                    # verdict again, with that send's copies as they are now.
                    off, size = a.placed[-1]
                    if off + size < end:
                        c, st = self.writer.answer_now(off + size)
                plain = a.plain
                if plain is not None and c == ResponseCode.SUCCESS:
                    conn.answer_frame(self._plain_ok(plain, a, st))
                    if ctx.metrics is not None:
                        self._observe_status(st, a.started)
                    continue
                cmd = a.cmd if plain is None else _request_of(plain)
                assert cmd is not None
                resp = self._answer(cmd, a.reply_queue_id, a.placed, c, st)
                self._observe(resp, a.started)
                conn.answer(cmd, resp)

        self.writer.when_durable(end, durable)

    @staticmethod
    def _each(answers: list[_Answer | _RunAnswer]) -> list[_Answer]:
        """The answers send by send (a run's expanded)."""
        out: list[_Answer] = []
        for a in answers:
            if type(a) is _RunAnswer:
                out.extend(a.each())
            else:
                assert isinstance(a, _Answer)
                out.append(a)
        return out

    def _answer_ok(self, conn: LanePeer, answers: list[_Answer | _RunAnswer], status: str) -> None:
        """A group's answers when all succeeded (and no metrics to observe): the plain
        sends' frames encoded in one loop and queued together, in the group's order (a
        command's answer goes between them where it stands); a run's in one call, as one
        chunk."""
        frames: list[bytes] = []
        for a in answers:
            if type(a) is _RunAnswer:
                data = _send_frames.encode_send_oks(
                    a.sends, a.start, a.stop, VERSION, self._msg_id_prefix, a.queue_ids,
                    a.queue_offsets, a.offsets, status)
                if frames:
                    conn.answer_frames(frames)
                    frames = []
                conn.answer_chunk(data, a.stop - a.start)
                continue
            assert isinstance(a, _Answer)
            plain = a.plain
            if plain is not None:
                frames.append(self._plain_ok(plain, a, status))
                continue
            if frames:
                conn.answer_frames(frames)
                frames = []
            cmd = a.cmd
            assert cmd is not None
            conn.answer(cmd, self._answer(cmd, a.reply_queue_id, a.placed,
                                          ResponseCode.SUCCESS, status))
        if frames:
            conn.answer_frames(frames)

    def _plain_ok(self, send: SendFrame, a: _Answer, status: str) -> bytes:
        """The SUCCESS answer of a plain send, as :meth:`_answer` would make it."""
        placed = a.placed
        offset = placed[0][0]
        prefix = self._msg_id_prefix
        ids = (f"{prefix}{offset:016X}" if len(placed) == 1
               else ",".join([f"{prefix}{off:016X}" for off, _ in placed]))
        queue_offset = a.queue_offset if a.queue_offset >= 0 else self.ctx.queue_offset_at(offset)
        return _send_frames.encode_send_ok(send[2], send[1], VERSION, ids, a.reply_queue_id,
                                           queue_offset, status, offset)

    def _observe(self, resp: RemotingCommand, started: float) -> None:
        if self.ctx.metrics is not None:
            self._observe_status(resp.ext_fields.get(PUT_STATUS_FIELD) or str(resp.code),
                                 started)

    def _observe_status(self, status: str, started: float) -> None:
        m = self.ctx.metrics
        if m is not None:
            child = self._latency.get(status)
            if child is None:  # labels() costs a lock and a lookup: once per status
                child = self._latency[status] = m.send_latency.labels(status)
            child.observe(time.perf_counter() - started)

    async def _send(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        ctx = self.ctx
        if ctx.replication is not None and ctx.replication.awaiting_first_lease():
            # Just elected: its first lease is one heartbeat answer away (not a refusal).
            await ctx.replication.wait_for_first_lease()
        send = self._prepare(cmd, conn)
        prior = None if send.claim is None else self.producers.check(send.claim, send.topic,
                                                                     send.queue_id)
        placed = self._store(send, conn) if prior is None else prior.placed
        last_offset, last_size = placed[-1]
        code, status = await self.writer.await_durable(last_offset + last_size,
                                                       index_now=False)
        return self._answer(cmd, send.reply_queue_id, placed, code, status)

    def _prepare(self, cmd: RemotingCommand, conn: RequestPeer, group: _SendGroup | None = None) -> _Send:
        """Check a send and decide what to store where; Refused says why not.  ``group``:
        the group it came in, whose other sends may have made some checks already."""
        ctx = self.ctx
        v2 = cmd.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
        try:
            h = SendHeader.parse(cmd.ext_fields, v2=v2)
        except ProtocolError as exc:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        batch = h.batch or cmd.code == RequestCode.SEND_BATCH_MESSAGE
        claim = claim_in(h.properties) if PRODUCER_ID in h.properties else None
        if group is None or not group.writable:
            ctx.check_writable()
            if group is not None:
                group.writable = True  # nothing changes it within one dispatch
        cfg = group.topics.get(h.topic) if group is not None else None
        if cfg is None:
            cfg = self._writable_topic(h.topic)
            if group is not None:
                group.topics[h.topic] = cfg
        queue_id = h.queue_id
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)
        queue_id %= cfg.write_queue_nums
        # A diverted message (half, delayed) answers with the queue it was sent to and the
        # offset it got where it is held, as RocketMQ (the transaction's state table offset).
        reply_queue_id = queue_id
        born_host = group.born_host if group is not None else ctx.born_host(conn)
        born_ts = h.born_timestamp or int(time.time() * 1000)
        expected = self._expected_type(cfg)
        if batch:
            body = cmd.body
            sys_flag = h.sys_flag
            if sys_flag & SysFlag.COMPRESSED:
                # C++ compresses a whole batch over 4 KiB; inflate before splitting.
                try:
                    body = decompress(body, sys_flag, limit=MAX_INFLATED_BATCH_BYTES)
                except DecompressError as exc:
                    raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
                sys_flag = strip_compression(sys_flag)
            if expected is not None:
                self._check_batch_type(expected, body, sys_flag)
            if not transaction_type(sys_flag) and claim is None:
                count = _records.batch_plain(body, MAX_BATCH_ITEMS, RESERVED_KEYS,
                                             RESERVED_PREFIXES)
                if count > 0:
                    # The common batch: every entry's properties are already the bytes
                    # its record holds, and none asks for anything but storing.
                    return _Send(h.topic, queue_id, reply_queue_id, [], sys_flag, born_ts,
                                 born_host, body, count)
            try:
                items = decode_batch(body, max_items=MAX_BATCH_ITEMS)
            except ProtocolError as exc:
                raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
            if not items:
                raise Refused(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
            if transaction_type(sys_flag) or any(send_asks_for_delay(item.properties)
                                                 for item in items):
                # As RocketMQ: a batch is neither transactional nor delayed.
                raise Refused(ResponseCode.MESSAGE_ILLEGAL,
                              "transactional or delayed messages cannot be sent as a batch")
            if any(claim_in(item.properties) != claim for item in items):  # what a rebuild reads
                raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"a batch's entries must all carry "
                              f"its header's idempotence claim ({claim})")
            rows: list[tuple[bytes, str | dict[str, str], int, int]] = [
                (item.body, without_mark(item.properties), item.flag, 0) for item in items]
            topic = h.topic
        else:
            sys_flag = h.sys_flag
            topic, props = h.topic, h.properties
            if expected is not None:
                check_type(expected, decode_properties(props), sys_flag)
            if transaction_type(sys_flag) or asks_for_delay(props) or COMMITTED_MARK in props:
                if claim is not None:
                    raise Refused(ResponseCode.MESSAGE_ILLEGAL, "an idempotent send cannot be "
                                  "transactional or delayed (it is stored elsewhere first)")
                topic, queue_id, sys_flag, props = self._divert(h, queue_id)
            rows = [(cmd.body, props, h.flag, h.reconsume_times)]
        return _Send(topic, queue_id, reply_queue_id, rows, sys_flag, born_ts, born_host,
                     claim=claim)

    def _expected_type(self, cfg: Any) -> TopicMessageType | None:
        """The message type sends to this topic must have (None: any)."""
        if not cfg.attributes or not self.ctx.config.topic_message_type_check:
            return None
        return topic_message_type(cfg.attributes)

    @staticmethod
    def _check_batch_type(expected: TopicMessageType, body: bytes | memoryview,
                          sys_flag: int) -> None:
        try:
            items = decode_batch(body, max_items=MAX_BATCH_ITEMS)
        except ProtocolError as exc:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
        for item in items:
            check_type(expected, item.properties, sys_flag)

    def _writable_topic(self, topic: str) -> Any:
        """The config of a topic a producer may send to (created on first use when
        allowed); Refused says why not."""
        try:
            validate_topic_name(topic)
        except ConfigError as exc:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        if topic in INTERNAL_TOPICS:
            raise Refused(ResponseCode.NO_PERMISSION, f"topic {topic} is internal")
        cfg = self.topic_admin.ensure_topic(topic)
        if cfg is None:
            raise Refused(ResponseCode.TOPIC_NOT_EXIST,
                          f"topic {topic} does not exist on {self.ctx.broker_name}")
        if not cfg.perm & PERM_WRITE:
            raise Refused(ResponseCode.NO_PERMISSION, f"topic {topic} is not writable")
        return cfg

    def _store(self, send: _Send, conn: RequestPeer, grouped: bool = False) -> list[tuple[int, int]]:
        """Append the send's rows and start them towards the slaves (``grouped``: the
        group's close does, once for all its sends)."""
        try:
            if send.batch is not None:
                placed = self.writer.append_batch_now(send.topic, send.queue_id, send.batch,
                                                      send.batch_count, send.sys_flag,
                                                      send.born_timestamp, send.born_host)
            else:
                placed = self.writer.append_rows_now(send.topic, send.queue_id, send.rows,
                                                     send.sys_flag, send.born_timestamp,
                                                     send.born_host)
        except DiskFullError as exc:
            # Not the message's fault: RocketMQ answers a full disk with SERVICE_NOT_AVAILABLE,
            # which clients retry elsewhere.  Rows of a batch stored before it stay stored.
            raise Refused(ResponseCode.SERVICE_NOT_AVAILABLE, str(exc)) from None
        except StoreError as exc:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        ctx = self.ctx
        if (not grouped and ctx.replication is not None
                and getattr(conn, "in_flight", 0) <= 1):
            ctx.replication.push_now()  # alone on its connection: no turn to share
        if ctx.metrics is not None:
            self._count(placed)
        if send.claim is not None:
            self.producers.record(send.claim, send.topic, send.queue_id, placed, send.reply_queue_id)
        return placed

    def _answered_again(self, send: _Send, cmd: RemotingCommand, conn: LanePeer, started: float) -> bool:
        """A retried idempotent send: its original's result, once the verdict of the
        original's copies is known now (nothing stored); False: a new sequence, store it."""
        assert send.claim is not None
        prior = self.producers.check(send.claim, send.topic, send.queue_id)
        if prior is None:
            return False

        def durable(code: int, status: str) -> None:
            resp = self._answer(cmd, prior.reply_queue_id, prior.placed, code, status)
            self._observe(resp, started)
            conn.answer(cmd, resp)

        self.writer.when_durable(prior.end, durable)
        return True

    def _count(self, placed: list[tuple[int, int]]) -> None:
        m = self.ctx.metrics
        if m is not None:
            m.messages_stored.inc(len(placed))
            m.bytes_stored.inc(sum(size for _, size in placed))

    def _answer(self, cmd: RemotingCommand, reply_queue_id: int, placed: list[tuple[int, int]],
                code: int, status: str) -> RemotingCommand:
        return send_answer(self.ctx, self._msg_id_prefix, cmd, reply_queue_id, placed, code, status)

    def _divert(self, h: SendHeader, queue_id: int) -> tuple[str, int, int, str | dict[str, str]]:
        """Where a transactional or delayed send is stored instead of its topic."""
        props = decode_properties(h.properties)
        # Only the broker marks a message as a committed transaction's.
        props.pop(COMMITTED_MARK, None)
        kind = transaction_type(h.sys_flag)
        if kind == SysFlag.TRANSACTION_PREPARED:
            topic, qid, sys_flag = self.transactions.transform_half(
                h.topic, queue_id, props, h.sys_flag, h.producer_group)
            return topic, qid, sys_flag, props
        if kind != 0 and kind != SysFlag.TRANSACTION_COMMIT:
            raise Refused(ResponseCode.MESSAGE_ILLEGAL,
                          f"sysFlag {h.sys_flag:#x}: only a prepared message may be sent; "
                          f"commit or roll back with END_TRANSACTION")
        where = self.delayed.transform(h.topic, queue_id, props)
        if where is None:
            return h.topic, queue_id, h.sys_flag, props
        return where[0], where[1], h.sys_flag, props

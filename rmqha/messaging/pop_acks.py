"""ACK_MESSAGE, BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME: a consumer settles a
popped message with its receipt handle (RocketMQ's ``AckMessageProcessor`` and
``ChangeInvisibleTimeProcessor``).

Every handle is verified (:func:`rmqha.messaging.receipt.verify`: this broker group's
signature for the request's group), must name what the request names, and must still be
in flight (:func:`rmqha.messaging.pop_logic.check_in_flight`).  A refusal changes nothing
and answers RocketMQ's code (MESSAGE_ILLEGAL for a handle that is not a valid one,
NO_MESSAGE for one that is no longer in flight) with a remark saying why and the ext
field ``receiptStatus`` (:class:`rmqha.messaging.receipt.Refusal`).

An accepted ack or change is one state record (``pop_ack`` / ``pop_change``, one per
request), answered once it is durable by the broker's ack policy: an acked message is
never delivered again after a failover.  A change answers the new handle in the ext field
``extraInfo`` besides RocketMQ's ``popTime`` / ``invisibleTime`` / ``reviveQid``
(RocketMQ's Java client builds a handle from those; it never uses it again, and rmqha
would not accept it: only the signed one acks).

BATCH_ACK_MESSAGE takes RocketMQ's body; each entry must carry its receipt handles in
``rh`` (RocketMQ's BatchAck names offsets only, which nothing can verify).  The valid acks
of a batch are applied, the refused ones named in the body ``{"results": [...]}``; the
code is SUCCESS when all were accepted, else the first refusal's.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from rmqha.errors import ProtocolError, ReceiptError, StoreError
from rmqha.messaging.context import Handler, MessagingContext, Refused
from rmqha.messaging.log_writer import LogWriter
from rmqha.messaging.pop_ledger import PopLedger
from rmqha.messaging.pop_logic import (
    check_in_flight,
    check_request,
    describe_refusal,
    next_pop_time,
)
from rmqha.messaging.pop_state import ack_record, change_record
from rmqha.messaging.receipt import ReceiptHandle, Refusal, parse, refuse, verify
from rmqha.net.peer import RequestPeer
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.headers import AckHeader
from rmqha.protocol.pop import BatchAck, parse_batch_ack_body

log = logging.getLogger(__name__)

#: Ext field naming why a receipt handle was refused.
RECEIPT_STATUS_FIELD = "receiptStatus"
READY_WAIT_S = 3.0


class PopAcks:
    """Acks and invisible-time changes of popped messages."""

    def __init__(self, ctx: MessagingContext, ledger: PopLedger, writer: LogWriter) -> None:
        self.ctx = ctx
        self.ledger = ledger
        self.writer = writer

    def handlers(self) -> dict[int, Handler]:
        rc = RequestCode
        return {rc.ACK_MESSAGE: self.on_ack, rc.BATCH_ACK_MESSAGE: self.on_batch_ack,
                rc.CHANGE_MESSAGE_INVISIBLETIME: self.on_change}

    async def _admit(self) -> None:
        """Master, holding the whole inherited pop state; Refused otherwise."""
        self.ctx.check_writable()
        if not self.ledger.ready() and not await self.ledger.wait_ready(READY_WAIT_S):
            self.ctx.check_writable()
            raise Refused(ResponseCode.SYSTEM_BUSY, self.ledger.behind())

    def _settle(self, h: AckHeader) -> tuple[ReceiptHandle, Any]:
        """The verified handle of a single ack or change and its in-flight entry."""
        if self.ctx.topics.get(h.topic) is None:
            raise Refused(ResponseCode.TOPIC_NOT_EXIST,
                          f"topic[{h.topic}] not exist, apply first please!")
        handle = verify(h.extra_info, self.ledger.key(), h.consumer_group,
                        self.ctx.broker_name)
        check_request(handle, h.consumer_group, h.topic, h.queue_id, h.offset)
        entry = check_in_flight(self.ledger.pop, h.consumer_group, handle, self.ledger.now_ms())
        return handle, entry

    async def _durable(self, cmd: RemotingCommand, placed: tuple[int, int],
                       ext: dict[str, Any] | None = None, body: bytes = b"") -> RemotingCommand:
        code, status = await self.writer.await_durable(placed[0] + placed[1])
        remark = None if code == ResponseCode.SUCCESS else (
            f"{status}: recorded but not confirmed by the replicas in time")
        return cmd.response(code, remark, ext or {}, body)

    # --- ACK_MESSAGE -------------------------------------------------------------------

    async def on_ack(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            h = AckHeader.from_ext(cmd.ext_fields)
            await self._admit()
            handle, entry = self._settle(h)
            placed = self.ledger.write(ack_record([[h.consumer_group, handle.topic,
                                                    handle.queue_id, handle.offset,
                                                    handle.pop_time]]))
        except (ReceiptError, ProtocolError, Refused, StoreError) as exc:
            return _not_settled(cmd, exc, "ack")
        if entry.fifo:
            self.ledger.wake([handle.topic])
        return await self._durable(cmd, placed)

    # --- CHANGE_MESSAGE_INVISIBLETIME --------------------------------------------------

    async def on_change(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            h = AckHeader.from_ext(cmd.ext_fields, change=True)
            if h.invisible_time is None or h.invisible_time <= 0:
                raise ProtocolError(f"invisibleTime must be positive, got {h.invisible_time}")
            await self._admit()
            handle, entry = self._settle(h)
            pop_time = next_pop_time(self.ledger.now_ms(), entry.pop_time)
            placed = self.ledger.write(change_record([[
                h.consumer_group, handle.topic, handle.queue_id, handle.offset,
                handle.pop_time, pop_time, h.invisible_time]]))
        except (ReceiptError, ProtocolError, Refused, StoreError) as exc:
            return _not_settled(cmd, exc, "change")
        if entry.fifo:
            self.ledger.wake([handle.topic])
        renewed = handle.renewed(pop_time, h.invisible_time, self.ledger.epoch())
        return await self._durable(cmd, placed, {
            "popTime": pop_time, "invisibleTime": h.invisible_time,
            "reviveQid": handle.revive_qid,
            "extraInfo": renewed.sign(self.ledger.key(), h.consumer_group)})

    # --- BATCH_ACK_MESSAGE -------------------------------------------------------------

    async def on_batch_ack(self, cmd: RemotingCommand, conn: RequestPeer) -> RemotingCommand:
        try:
            _, entries = parse_batch_ack_body(cmd.body)
            if not entries:
                return cmd.response(ResponseCode.NO_MESSAGE, "batch ack names no message", {})
            await self._admit()
        except ProtocolError as exc:
            return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
        except Refused as r:
            return cmd.response(r.code, r.remark, r.ext)
        acks: list[list[Any]] = []
        results: list[dict[str, Any]] = []
        woken: set[str] = set()
        for entry in entries:
            for result, ack, fifo in self._batch_entry(entry):
                results.append(result)
                if ack is not None:
                    acks.append(ack)
                    if fifo:
                        woken.add(str(ack[1]))
        refused = [r for r in results if r["status"] != "OK"]
        placed = None
        if acks:
            try:
                placed = self.ledger.write(ack_record(acks))
            except StoreError as exc:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"acks not recorded: {exc}", {})
        self.ledger.wake(woken)
        body = json.dumps({"results": results}).encode()
        if refused:
            first = refused[0]
            remark = (f"{len(refused)} of {len(results)} acks refused; first: "
                      f"{first['remark']}")
            if placed is not None:
                await self.writer.await_durable(placed[0] + placed[1])
            return cmd.response(first["code"], remark,
                                {RECEIPT_STATUS_FIELD: first["status"]}, body)
        assert placed is not None
        return await self._durable(cmd, placed, body=body)

    def _batch_entry(self, entry: BatchAck) -> list[tuple[dict[str, Any], list[Any] | None,
                                                          bool]]:
        """(result, ack record entry or None, FIFO) per message a BatchAck names."""
        out: list[tuple[dict[str, Any], list[Any] | None, bool]] = []
        if not entry.handles:
            for off in entry.offsets or [entry.start_offset]:
                exc = refuse(Refusal.UNSIGNED, "batch ack entry carries no receipt handles "
                             "('rh'): RocketMQ's BatchAck names offsets only, which cannot be "
                             "verified; send the handles")
                out.append((_result(entry.topic, entry.queue_id, off, exc), None, False))
            return out
        key = self.ledger.key()
        now = self.ledger.now_ms()
        bits = set(entry.offsets)
        for text in entry.handles:
            try:
                handle = verify(text, key, entry.group, self.ctx.broker_name)
                check_request(handle, entry.group, entry.topic, entry.queue_id, handle.offset)
                if bits and handle.offset not in bits:
                    raise refuse(Refusal.MISMATCH, f"receipt handle of offset {handle.offset} "
                                 f"is not among the entry's bit set {sorted(bits)}")
                inflight = check_in_flight(self.ledger.pop, entry.group, handle, now)
            except ReceiptError as exc:
                out.append((_result(entry.topic, entry.queue_id, _offset_of(text), exc),
                            None, False))
                continue
            ack = [entry.group, handle.topic, handle.queue_id, handle.offset, handle.pop_time]
            out.append(({"topic": handle.topic, "queueId": handle.queue_id,
                         "offset": handle.offset, "status": "OK", "code": 0, "remark": ""},
                        ack, inflight.fifo))
        return out


def _offset_of(text: str) -> int:
    """The offset a (possibly bad) handle names, for the results; -1 if it names none."""
    try:
        return parse(text).offset
    except ReceiptError:
        return -1


def _result(topic: str, queue_id: int, offset: int, exc: ReceiptError) -> dict[str, Any]:
    code, remark, status = describe_refusal(exc)
    return {"topic": topic, "queueId": queue_id, "offset": offset, "status": status,
            "code": code, "remark": remark}


def _not_settled(cmd: RemotingCommand, exc: Exception, what: str) -> RemotingCommand:
    """The answer to an ack or change that changed nothing, by why."""
    if isinstance(exc, ReceiptError):
        return _refused(cmd, exc)
    if isinstance(exc, Refused):
        return cmd.response(exc.code, exc.remark, exc.ext)
    if isinstance(exc, ProtocolError):
        return cmd.response(ResponseCode.INVALID_PARAMETER, str(exc), {})
    return cmd.response(ResponseCode.SYSTEM_ERROR, f"{what} not recorded: {exc}", {})


def _refused(cmd: RemotingCommand, exc: ReceiptError) -> RemotingCommand:
    code, remark, status = describe_refusal(exc)
    return cmd.response(code, remark, {RECEIPT_STATUS_FIELD: status})

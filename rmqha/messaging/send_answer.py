"""A stored send's answer: message ids, queue, queue offset, put status, and a remark that
says why a send short of SEND_OK is stored but not confirmed.

Apart from :mod:`rmqha.messaging.send_path` so the path keeps to its ways in; every answer
to a stored send (a group's, a task's, a retried idempotent send's) is made here.
"""
from __future__ import annotations

from rmqha.messaging.context import PUT_STATUS_FIELD, MessagingContext
from rmqha.messaging.log_writer import FLUSH_DISK_FAILED
from rmqha.messaging.send_rules import prepared_transaction_id
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.command import RemotingCommand


def send_answer(ctx: MessagingContext, msg_id_prefix: str, cmd: RemotingCommand,
                reply_queue_id: int, placed: list[tuple[int, int]], code: int,
                status: str) -> RemotingCommand:
    """The answer to ``cmd``, stored at ``placed``, with this code and put status
    (``msg_id_prefix``: the offsetMsgId's host part)."""
    first_offset, _ = placed[0]
    queue_offset = ctx.queue_offset_at(first_offset)
    ids = ",".join([f"{msg_id_prefix}{off:016X}" for off, _ in placed])
    ext = {"msgId": ids, "queueId": str(reply_queue_id),
           "queueOffset": str(queue_offset), PUT_STATUS_FIELD: status,
           "commitLogOffset": str(first_offset)}
    transaction_id = prepared_transaction_id(cmd)
    if transaction_id:
        ext["transactionId"] = transaction_id
    if code == ResponseCode.SUCCESS:
        remark = None
    elif status == FLUSH_DISK_FAILED:
        remark = (f"{status}: stored at {first_offset} but the fsync failed, so it is not "
                  f"known to be on disk (the broker log says why)")
    else:
        remark = (f"{status}: stored at {first_offset} but not confirmed by "
                  f"{_copies_wanted(ctx)} in time{_short_set_note(ctx)}")
    return cmd.reply(int(code), remark, ext)


def _copies_wanted(ctx: MessagingContext) -> str:
    need = int(ctx.config.min_in_sync_replicas)
    return f"min_in_sync_replicas={need} copies" if need > 1 else "the replicas"


def _short_set_note(ctx: MessagingContext) -> str:
    """Why a wait fell short when the SyncStateSet shrank below the floor meanwhile."""
    replication = ctx.replication
    need = int(ctx.config.min_in_sync_replicas)
    if replication is None or need <= 1 or replication.sync_state_set_size() >= need:
        return ""
    return (f" (the SyncStateSet shrank to {replication.sync_state_set_size()} while it "
            f"waited; it may still be delivered once the replicas catch up)")

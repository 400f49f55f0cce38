"""Blocks into an HA slave's log (:class:`BlockAppender`): checked, appended, their epochs.

Every block must continue the log: it starts at exactly the log's max offset, under an
epoch not older than the log's last, never across a segment end, with an epoch start that
agrees with the log's entries; anything else is a ProtocolError before a byte of it is
stored.  The commitlog validates the records and undoes a bad block.  A block whose epoch
is newer than the log's last opens an epoch entry (:class:`rmqha.ha.slave_epochs.EpochWriter`,
after the data: an entry missing after a crash only makes the next handshake cut back to
the previous epoch's end, safe, never the reverse).  Each block's confirm offset is
learnt (:class:`rmqha.ha.slave_state.ConfirmTracker`), and a block stored while the disk
was full ends that state (:class:`rmqha.ha.disk_full.DiskFullWatch`).

Two jumps are allowed, each only as stated: the session's first block beyond this log's
end at a segment start (retention on the master removed the bytes in between: the log
restarts there), and an empty log starting where the master says.

RocketMQ's master (AutoSwitchHAConnection.transferToSlave) cuts a batch at the end of the
epoch it is sending, switches to the next epoch, and only then builds the header: in the
``rocketmq`` dialect the last chunk of epoch N arrives labelled with epoch N+1 and N+1's
start offset (where the chunk ends), and a batch that ended exactly at N's end is
followed by an empty chunk labelled N+1.  RocketMQ's slave records an entry whenever the
label changes; exactly that is accepted here, nothing looser.
"""
from __future__ import annotations

import logging
from typing import Any

from rmqha.errors import ProtocolError
from rmqha.ha.dialects import Block
from rmqha.ha.disk_full import DiskFullWatch
from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.ha.slave_epochs import EpochWriter
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress, SlaveState
from rmqha.ha.truncation import Truncator

# The slave side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.slave")


class BlockAppender:
    """Applies one session's blocks to the slave's log."""

    def __init__(self, commitlog: ReplicatedLog, epochs: EpochWriter, truncator: Truncator, progress: SlaveProgress,
                 confirm: ConfirmTracker, disk: DiskFullWatch, *, protocol: str, master: str,
                 master_pairs: list[tuple[int, int]]) -> None:
        self.commitlog = commitlog
        self.epochs = epochs
        self.truncator = truncator
        self.progress = progress
        self.confirm = confirm
        self.disk = disk
        self.protocol = protocol
        self.master = master
        #: The master's (epoch, start) entries from this session's handshake.
        self.master_pairs = master_pairs
        #: No data block applied yet in this session (the only time a jump is accepted).
        self.first_block = True

    def apply(self, blocks: list[Any]) -> None:
        cl = self.commitlog
        for b in blocks:
            if type(b) is not Block:
                raise ProtocolError(f"unexpected {type(b).__name__} during transfer")
            size = len(b.data)
            new_epoch = self.check(b, size)
            if size:
                # Data first: the commitlog validates the records and undoes a bad block, and
                # an epoch entry missing after a crash only makes the next handshake cut
                # back to the previous epoch's end (safe), never the reverse.
                cl.append_data(b.offset, b.data, wait_flush=False)
            self.done(b, size, new_epoch)

    def apply_views(self, blocks: list[Block]) -> None:
        """:meth:`apply` blocks whose data are views of the receive buffer, then release
        those views so the buffer can be reused."""
        if blocks:
            self.apply(blocks)
            for b in blocks:
                b.data.release()

    def append_run(self, view: memoryview, spans: Any, start: int) -> None:
        """Append a run of blocks that continue this log in its last epoch, checked by
        ``frames.scan_transfer_run`` (``spans``: data position in ``view``, size and the
        confirm offset learnt, per block; the first block at ``start``, this log's max
        offset) with one ``commitlog.append_run``, and what :meth:`done` records once for
        the run.  A block the commitlog refuses raises with the blocks before it stored, as
        :meth:`apply` does."""
        cl = self.commitlog
        stored = False
        try:
            cl.append_run(start, view, spans, wait_flush=False)
            stored = True
        finally:
            learnt = spans[-1] if stored else _learnt_before(spans, start, cl.max_offset)
            if learnt >= 0:
                self.first_block = False
                self.progress.state = SlaveState.TRANSFER
                self.confirm.learn(learnt)

    def check(self, b: Block, size: int) -> bool:
        """Refuse (ProtocolError) a block that cannot continue this log, before any of it
        is stored; start an empty log where the block says when allowed.  True when the
        block opens a new epoch."""
        cl = self.commitlog
        seg_bytes = cl.segment_bytes
        mx = cl.max_offset
        last_epoch = self.epochs.last_epoch()
        if size == 0 and b.offset == -1:
            pass  # a RocketMQ master with an empty log heartbeats at -1
        else:
            if b.offset != mx:
                if self._may_restart(b, size):
                    self.truncator.restart_at(b.offset, self.master)
                    mx = cl.max_offset
                    last_epoch = self.epochs.last_epoch()
                elif not self._may_rebase(b.offset, size):
                    raise ProtocolError(
                        f"block at offset {b.offset} ({size} bytes) does not start at this "
                        f"slave's max offset {mx}"
                    )
            if b.epoch < last_epoch:
                raise ProtocolError(f"block epoch {b.epoch} is older than this slave's epoch {last_epoch}")
            if b.epoch_start > b.offset and not self._ends_epoch_early_label(b, size, last_epoch):
                raise ProtocolError(f"block at {b.offset} claims its epoch {b.epoch} starts later, at {b.epoch_start}")
        if not size:
            return self._announces_epoch(b, mx, last_epoch)
        end = b.offset + size
        seg_end = b.offset - b.offset % seg_bytes + seg_bytes
        if end > seg_end:
            raise ProtocolError(f"block {b.offset}..{end} crosses the segment end {seg_end}")
        last = self.epochs.last_entry()
        new_epoch = b.epoch > last_epoch
        if new_epoch:
            if last is not None and b.epoch_start < last[1]:
                raise ProtocolError(
                    f"block epoch {b.epoch} starts at {b.epoch_start}, before the last epoch's start {last[1]}"
                )
        elif last is not None and last[1] != b.epoch_start:
            raise ProtocolError(
                f"block epoch {b.epoch} starts at {b.epoch_start} but this slave has it at {last[1]}"
            )
        if b.offset != mx:
            self.truncator.rebase(b.offset)
        return new_epoch

    def done(self, b: Block, size: int, new_epoch: bool) -> None:
        """After a block's data is in the log: its epoch entry, the state, the confirm offset."""
        cl = self.commitlog
        if size:
            self.first_block = False
            if self.disk.active:
                self.disk.stored(cl.max_offset)
            if new_epoch:
                if b.epoch_start > b.offset:
                    self._persist_unlabelled_epoch(b)
                self.epochs.persist(b.epoch, b.epoch_start)
            self.progress.state = SlaveState.TRANSFER
        else:
            if new_epoch:
                self.epochs.persist(b.epoch, b.epoch_start)
            if b.offset == cl.max_offset:
                self.progress.state = SlaveState.SUSPEND
        self.confirm.learn(min(b.confirm, cl.max_offset))  # on_confirm hears of it after the ack

    # --- RocketMQ's early epoch label ----------------------------------------------------------

    def _ends_epoch_early_label(self, b: Block, size: int, last_epoch: int) -> bool:
        """The chunk ending epoch N, labelled N+1: rocketmq dialect, data that end exactly
        where the labelled (newer) epoch starts.  Nothing looser."""
        return (self.protocol == "rocketmq" and size > 0 and b.offset + size == b.epoch_start
                and b.epoch > last_epoch)

    def _announces_epoch(self, b: Block, max_offset: int, last_epoch: int) -> bool:
        """An empty rocketmq chunk opening a newer epoch exactly at this log's end (True:
        record it now, as RocketMQ's slave does; the chunks that follow carry its data)."""
        if self.protocol != "rocketmq" or b.epoch <= last_epoch:
            return False
        last = self.epochs.last_entry()
        return b.offset == b.epoch_start == max_offset and (last is None or last[1] <= max_offset)

    def _persist_unlabelled_epoch(self, b: Block) -> None:
        """The early-labelled chunk carries data of an epoch this slave may never have seen a
        label of (a session that starts at that epoch's start, and the whole epoch fits in
        one chunk): take it from the master's handshake, the epoch just before the labelled
        one, when it is newer than this log's last and starts within what this log holds."""
        pairs = self.master_pairs
        for i in range(1, len(pairs)):
            epoch, start = pairs[i - 1]
            if pairs[i] == (b.epoch, b.epoch_start):
                last = self.epochs.last_entry()
                if epoch > self.epochs.last_epoch() and start <= b.offset and (last is None or start >= last[1]):
                    log.info("HA slave %d: epoch %d (from %d) learnt from the master's handshake",
                             self.truncator.broker_id, epoch, start)
                    self.epochs.persist(epoch, start)
                return

    # --- the two allowed jumps -----------------------------------------------------------------

    def _may_restart(self, b: Block, size: int) -> bool:
        """The master's log starts beyond this slave's end (retention deleted the bytes in
        between): it says so by starting the session's first block there, at a segment
        start above this log's max offset, in an epoch not older than this log's last."""
        cl = self.commitlog
        return (
            self.first_block
            and 0 < size <= cl.segment_bytes
            and b.offset > cl.max_offset > cl.min_offset
            and b.offset % cl.segment_bytes == 0
            and b.epoch_start <= b.offset
            and b.epoch >= self.epochs.epoch_map.last_epoch()
        )

    def _may_rebase(self, offset: int, size: int) -> bool:
        """An empty log may start where the master says (its min offset or last segment)."""
        cl = self.commitlog
        return size > 0 and cl.max_offset <= cl.min_offset and offset % cl.segment_bytes == 0


def _learnt_before(spans: Any, start: int, end: int) -> int:
    """The confirm offset learnt from the blocks of a run (``spans`` as
    :meth:`BlockAppender.append_run` takes them, the first block at ``start``) that end
    at or before ``end``; -1 when none does."""
    learnt = -1
    at = start
    for i in range(0, len(spans), 3):
        at += spans[i + 1]
        if at > end:
            break
        learnt = spans[i + 2]
    return learnt

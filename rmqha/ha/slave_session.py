"""One connection of an HA slave to its master (:class:`SlaveSession`).

A session walks the slave's connection states once: HANDSHAKE (connect; with TLS, the
TLS handshake and the master's certificate, :class:`rmqha.ha.tls_link.HATls`; with a cluster
secret, authenticate the link both ways, :func:`rmqha.ha.auth.authenticate`, after which
every frame of a plaintext link is sealed and checked; introduce itself
with group id, segment size, flags and last epoch; get the master's epoch entries; cut the
commitlog and the epoch map at the consistent point, :class:`rmqha.ha.truncation.Truncator`;
tell the master where to send from, :class:`rmqha.ha.handshake.SlaveHandshake`), then
TRANSFER and SUSPEND (:class:`rmqha.ha.receive.Receiver`) until the link fails, which
:meth:`SlaveSession.run` raises.  Reconnecting is the owner's job
(:class:`rmqha.ha.slave.HASlave`).
"""
from __future__ import annotations

import logging
import time

from rmqha.errors import ReplicationError
from rmqha.ha.appender import BlockAppender
from rmqha.ha.auth import HAAuth, authenticate
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import slave_codec
from rmqha.ha.disk_full import DiskFullWatch
from rmqha.ha.handshake import Identity, SlaveHandshake
from rmqha.ha.link import Link, connect
from rmqha.ha.receive import Receiver
from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.ha.slave_epochs import EpochWriter
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress, SlaveState
from rmqha.ha.tls_link import HATls, TlsLink
from rmqha.ha.truncation import Truncator

# The slave side logs under one name, whichever module says it (operators filter on it).
log = logging.getLogger("rmqha.ha.slave")


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ReplicationError(f"master HA address {address!r} is not host:port")
    return host or "127.0.0.1", int(port)


class SlaveSession:
    """One connection to ``master``, from connect until the link fails."""

    def __init__(self, master: str, me: Identity, *, commitlog: ReplicatedLog, config: HAConfig, protocol: str,
                 progress: SlaveProgress, confirm: ConfirmTracker, epochs: EpochWriter,
                 truncator: Truncator, disk: DiskFullWatch, auth: HAAuth | None = None,
                 tls: HATls | None = None) -> None:
        self.master = master
        self.auth = auth
        self.tls = tls
        self.me = me
        self.commitlog = commitlog
        self.config = config
        self.protocol = protocol
        self.progress = progress
        self.confirm = confirm
        self.epochs = epochs
        self.truncator = truncator
        self.disk = disk
        self.link: Link | None = None
        self.receiver: Receiver | None = None
        #: Whether the handshake completed (the transfer started).
        self.transferring = False

    def close(self) -> None:
        """End the session (its run raises LinkClosed once it has a link).  The compiled
        lane, if it runs, is stopped and joined first: once this returns, nothing of the
        session writes the log."""
        if self.receiver is not None:
            self.receiver.close_lane()
        if self.link is not None:
            self.link.close()

    @property
    def bytes_in(self) -> int:
        return self.link.bytes_in if self.link is not None else 0

    async def run(self) -> None:
        cfg = self.config
        host, port = split_address(self.master)
        sock = await connect(host, port, cfg.ha_connect_timeout_ms / 1000)
        link = self.link = Link(sock) if self.tls is None else self.tls.dial(sock)
        codec = slave_codec(self.protocol, cfg.max_frame_bytes)
        self.progress.sessions += 1
        self.progress.state = SlaveState.HANDSHAKE
        timeout = cfg.ha_housekeeping_interval_ms / 1000
        if self.tls is not None and isinstance(link, TlsLink):
            await self.tls.secure(link, timeout)
            log.debug("HA link to %s over TLS: master %s", self.master, link.peer_identity)
        if self.auth is not None and codec.name == "framed":
            # (A rocketmq-dialect slave with a secret exists only where that dialect may
            # run unauthenticated: HASlave checked.)
            proof = await authenticate(link, self.auth, timeout)
            codec.authenticate(proof)
            log.debug("HA link to %s authenticated: master %s", self.master, proof.peer)
        handshake = SlaveHandshake(link, codec, self.master, timeout, on_read=self._read, on_write=self._wrote)
        offset, pairs = await self._handshake(handshake)
        self.progress.state = SlaveState.TRANSFER
        self.transferring = True
        appender = BlockAppender(self.commitlog, self.epochs, self.truncator, self.progress, self.confirm,
                                 self.disk, protocol=self.protocol, master=self.master, master_pairs=pairs)
        receiver = self.receiver = Receiver(link, codec, appender, config=cfg, epochs=self.epochs,
                                            confirm=self.confirm, progress=self.progress)
        try:
            await receiver.run(handshake.pending)
        finally:
            receiver.close_lane()

    async def _handshake(self, handshake: SlaveHandshake) -> tuple[int, list[tuple[int, int]]]:
        """Hello, epochs, the cut, the confirm: the offset the transfer starts from and the
        master's (epoch, start) entries."""
        em = self.epochs.epoch_map
        hello, entries = await handshake.introduce(self.me, self.commitlog.segment_bytes, em.last_epoch())
        self.progress.master_max_offset = hello.max_offset
        offset = self.truncator.to_consistent_point(entries, self.master)
        await handshake.confirm(offset, em.last_epoch())
        # While the disk is full every session says it again; the watch speaks for them.
        level = logging.DEBUG if self.disk.active else logging.INFO
        log.log(level, "HA slave %d following %s (%s) from offset %d, master max %d",
                self.me.broker_id, self.master, handshake.codec.name, offset, hello.max_offset)
        return offset, [(e, s) for e, s, _ in entries]

    def _read(self) -> None:
        self.progress.last_read = time.monotonic()

    def _wrote(self) -> None:
        self.progress.last_write = time.monotonic()

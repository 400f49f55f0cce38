"""The slave side of HA replication (:class:`HASlave`): the public face of its parts.

One :class:`HASlave` keeps this broker's commitlog a byte-for-byte prefix of its master's.
It walks the connection states of the HA protocol:

* READY: the store is recovered and the master's HA address known; connect (with an
  exponential backoff, reset once a link worked, kept growing while the disk is full,
  :mod:`rmqha.ha.disk_full`) — this module;
* HANDSHAKE: with TLS, the TLS handshake and the master's certificate
  (:mod:`rmqha.ha.tls_link`); with a cluster secret, authenticate the link both ways (:mod:`rmqha.ha.auth`);
  introduce itself, get the master's epoch entries, cut the log at the
  consistent point, tell the master where to send from — :mod:`rmqha.ha.slave_session`,
  :mod:`rmqha.ha.handshake`, :mod:`rmqha.ha.truncation`;
* TRANSFER / SUSPEND: append every block at exactly the log's max offset, record the
  epochs the blocks open (off the transfer path; acks wait for them), ack, keep the
  master's confirm offset — :mod:`rmqha.ha.receive`, :mod:`rmqha.ha.appender`,
  :mod:`rmqha.ha.slave_epochs`;
* SHUTDOWN after :meth:`HASlave.stop`.

Every bad frame closes the link with a logged reason, and nothing of it becomes part of
the log: headers are checked before a byte is stored, records before max_offset moves (a
body already received into the mapping is zeroed again).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from rmqha.errors import AuthenticationError, ConfigError, EpochError, ProtocolError, ReplicationError, StoreError
from rmqha.ha.auth import HAAuth
from rmqha.ha.config import HAConfig
from rmqha.ha.dialects import slave_codec
from rmqha.ha.disk_full import DiskFullWatch, is_disk_full
from rmqha.ha.handshake import Identity
from rmqha.ha.link import LinkClosed, LinkTimeout
from rmqha.ha.replicated_log import ReplicatedLog
from rmqha.ha.slave_epochs import EpochWriter
from rmqha.ha.slave_session import SlaveSession
from rmqha.ha.slave_state import ConfirmTracker, SlaveProgress, SlaveState
from rmqha.ha.tls_link import HATls, check_tls_group
from rmqha.ha.truncation import Truncator

log = logging.getLogger(__name__)

__all__ = ["HASlave", "SlaveState"]

#: What ends a session without ending the slave: it reconnects.
_SESSION_ERRORS = (LinkClosed, LinkTimeout, ProtocolError, ReplicationError, EpochError, StoreError,
                   AuthenticationError, OSError, asyncio.TimeoutError)


class HASlave:
    """Replicates the master at ``master_ha_address`` into ``commitlog`` and ``epoch_map``."""

    def __init__(
        self,
        commitlog: ReplicatedLog,
        epoch_map: Any,
        *,
        group: str,
        broker_id: int,
        master_ha_address: str,
        config: HAConfig | None = None,
        async_learner: bool = False,
        protocol: str | None = None,
        on_confirm: Callable[[int], Any] | None = None,
        on_truncate: Callable[[int], Any] | None = None,
        address: str = "",
        auth: HAAuth | None = None,
        tls: HATls | None = None,
    ) -> None:
        """``auth``: the cluster secret and this broker's identity, to authenticate every
        link (None: unauthenticated, as without a cluster secret); ``tls``: dial the master
        over mutual TLS (None: plaintext)."""
        check_tls_group(tls, group)
        self.tls = tls
        self.commitlog = commitlog
        self.epoch_map = epoch_map
        self.group = group
        self.broker_id = int(broker_id)
        self.config = config or HAConfig()
        self.async_learner = async_learner
        self.protocol = protocol or self.config.ha_protocol
        slave_codec(self.protocol, self.config.max_frame_bytes)  # validates the name now
        if auth is not None:
            auth.check_group(group)
            if self.protocol != "framed" and not auth.allow_unauthenticated_rocketmq:
                raise ConfigError(
                    f"the {self.protocol} HA dialect cannot be authenticated: with a cluster secret it "
                    "needs ha_allow_unauthenticated_rocketmq_dialect = true")
            if self.protocol != "framed":
                log.warning("HA slave %d speaks the %s dialect, which cannot be authenticated: its link "
                            "runs without (ha_allow_unauthenticated_rocketmq_dialect)", self.broker_id,
                            self.protocol)
        self.auth = auth
        self.address = address
        self._master = master_ha_address
        self._progress = SlaveProgress()
        self._confirm = ConfirmTracker(on_confirm)
        self._epochs = EpochWriter(epoch_map, self.broker_id)
        self._disk = DiskFullWatch(self.broker_id)
        self._truncator = Truncator(commitlog, epoch_map, self.broker_id, self._progress, self._confirm,
                                    on_truncate)
        self._task: asyncio.Task[None] | None = None
        self._session: SlaveSession | None = None
        self._stopped = False
        self._kick: asyncio.Event | None = None

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._kick = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopped = True
        if self._session is not None:
            self._session.close()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._task = None
        self._epochs.close()
        self._progress.state = SlaveState.SHUTDOWN
        log.info("HA slave %d stopped", self.broker_id)

    # --- public state ------------------------------------------------------------------------

    @property
    def state(self) -> SlaveState:
        return self._progress.state

    @property
    def confirm_offset(self) -> int:
        """The master's confirm offset, never above this log's max offset."""
        return min(self._confirm.confirm, self.commitlog.max_offset)

    @property
    def master_ha_address(self) -> str:
        return self._master

    @property
    def sessions(self) -> int:
        return self._progress.sessions

    @property
    def last_error(self) -> str:
        return self._progress.last_error

    @property
    def last_truncate(self) -> int | None:
        return self._progress.last_truncate

    @property
    def bytes_dropped(self) -> int:
        return self._progress.bytes_dropped

    @property
    def direct_receives(self) -> int:
        """Blocks received straight into the commitlog's mapping (framed, large blocks)."""
        return self._progress.direct_receives

    @property
    def callback_blocks(self) -> int:
        """Blocks (heartbeats included) applied by the transfer's reader callback."""
        return self._progress.callback_blocks

    @property
    def task_blocks(self) -> int:
        """Blocks applied by the session's task."""
        return self._progress.task_blocks

    @property
    def lane_blocks(self) -> int:
        """Blocks (heartbeats included) the compiled lane took (rmqha.ha.slave_lane)."""
        return self._progress.lane_blocks

    @property
    def handbacks(self) -> int:
        """How often the reader callback handed the link back to the task."""
        return self._progress.handbacks

    @property
    def master_max_offset(self) -> int:
        return self._progress.master_max_offset

    @property
    def disk_full(self) -> bool:
        """Whether this slave's store refuses the master's bytes for want of space."""
        return self._disk.active

    def set_master_address(self, address: str) -> None:
        """Follow a (new) master: the current link is closed and the next one goes there."""
        if address == self._master:
            return
        self._master = address
        if self._session is not None:
            self._session.close()
        if self._kick is not None:
            self._kick.set()

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        p = self._progress
        return {
            "role": "slave",
            "group": self.group,
            "broker_id": self.broker_id,
            "master_address": self._master,
            "protocol": self.protocol,
            "authenticated": self.auth is not None and self.protocol == "framed",
            "tls": self.tls is not None,
            "async_learner": self.async_learner,
            "state": p.state.value,
            "max_offset": self.commitlog.max_offset,
            "confirm_offset": self.confirm_offset,
            "master_max_offset": p.master_max_offset,
            "epoch": self.epoch_map.last_epoch(),
            "sessions": p.sessions,
            "last_error": p.last_error,
            "last_truncate": p.last_truncate,
            "last_read_ms_ago": int((now - p.last_read) * 1000) if p.last_read else None,
            "last_write_ms_ago": int((now - p.last_write) * 1000) if p.last_write else None,
            "bytes_received": self._session.bytes_in if self._session is not None else 0,
            "lane_blocks": p.lane_blocks,
            "lane_runs": p.lane_runs,
            **self._disk.status(),
        }

    # --- connection loop -----------------------------------------------------------------------

    def _new_session(self) -> SlaveSession:
        me = Identity(self.broker_id, self.address, self.config.sync_from_last_file, self.async_learner)
        return SlaveSession(self._master, me, commitlog=self.commitlog, config=self.config,
                            protocol=self.protocol, progress=self._progress, confirm=self._confirm,
                            epochs=self._epochs, truncator=self._truncator, disk=self._disk, auth=self.auth,
                            tls=self.tls)

    async def _run(self) -> None:
        cfg = self.config
        backoff = cfg.ha_reconnect_min_ms
        while not self._stopped:
            self._progress.state = SlaveState.READY
            start_max = self.commitlog.max_offset
            worked = await self._one_session()
            if self._stopped:
                break
            # The link worked: retry soon; not while the disk is full, however far the
            # session got: the next one meets the same full disk.
            if (worked or self.commitlog.max_offset != start_max) and not self._disk.active:
                backoff = cfg.ha_reconnect_min_ms
            self._progress.state = SlaveState.READY
            await self._pause(backoff / 1000)
            backoff = min(backoff * 2, cfg.ha_reconnect_max_ms)

    async def _one_session(self) -> bool:
        """Run a session until it ends (logged); True if its transfer started."""
        session = self._session = self._new_session()
        try:
            await session.run()
        except asyncio.CancelledError:
            raise
        except _SESSION_ERRORS as exc:
            if not self._stopped:
                self._session_failed(exc)
        finally:
            session.close()
            self._session = None
            self._epochs.settle_now()
            # What the last blocks confirmed, whether or not their ack got out.
            self._confirm.tell()
        return session.transferring

    def _session_failed(self, exc: BaseException) -> None:
        """Record and log why a session ended (a full disk: once, by the watch)."""
        self._progress.last_error = f"{type(exc).__name__}: {exc}"
        if is_disk_full(exc):
            self._disk.refused(exc, self.commitlog.max_offset, self._master)
            return
        level = logging.INFO if isinstance(exc, (LinkClosed, ConnectionRefusedError)) else logging.WARNING
        log.log(level, "HA link to %s closed: %s", self._master, self._progress.last_error)

    async def _pause(self, seconds: float) -> None:
        """Wait before reconnecting, cut short by :meth:`set_master_address`."""
        assert self._kick is not None
        self._kick.clear()
        try:
            await asyncio.wait_for(self._kick.wait(), seconds)
        except asyncio.TimeoutError:
            pass

"""The broker's persistent identity: ``.broker.meta``, ``.broker.meta.temp`` and the id flow.

A broker's id is negotiated once with the controller and kept in the store directory:

- ``.broker.meta``       ``cluster#broker_name#broker_id``  (the id is settled)
- ``.broker.meta.temp``  ``cluster#broker_name#broker_id#register_code`` (an attempt in flight)

Both are written atomically (scratch file, fsync, rename, fsync of the directory), so a
crash leaves either the old content or the new one, never a torn file.  Start-up goes
like this:

1. ``.broker.meta`` present: the id is known; go straight to RegisterBrokerToController.
2. only the temp file: send ApplyBrokerId again with its id and register code (the
   controller accepts a free id or the same code again).
3. neither: GetNextBrokerId, write the temp file, ApplyBrokerId; on success write
   ``.broker.meta`` and delete the temp file.

A refused ApplyBrokerId (``CONTROLLER_BROKER_ID_INVALID``, the id went to someone else)
deletes the temp file and starts over with the next id.  A transport failure does *not*
(unlike RocketMQ, which deletes it): the apply may have been committed, so the same id and code
are retried; deleting the temp file there could orphan an id.

A meta file naming another cluster or broker name than the configuration stops the broker
with :class:`~rmqha.errors.BrokerIdentityError` naming both values; it never registers under
the wrong identity.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rmqha.failpoints import Failpoint, hit
from rmqha.protocol.codes import ResponseCode
from rmqha.errors import (
    BrokerIdentityError,
    CheckpointError,
    RemoteCommandError,
    RemotingError,
    ControllerError,
)

log = logging.getLogger(__name__)

META_FILE = ".broker.meta"
TEMP_META_FILE = ".broker.meta.temp"
# Scratch suffix of the atomic writer; a leftover one is a crash mid-write and is ignored.
_SCRATCH_SUFFIX = ".tmp"
# The files are a few dozen bytes; anything much larger is not ours.
_MAX_META_BYTES = 4096


@dataclass(frozen=True)
class BrokerMeta:
    """Content of ``.broker.meta``: the settled identity."""

    cluster: str
    broker_name: str
    broker_id: int

    def encode(self) -> str:
        return f"{self.cluster}#{self.broker_name}#{self.broker_id}"


@dataclass(frozen=True)
class TempBrokerMeta:
    """Content of ``.broker.meta.temp``: the id being applied for and the attempt's code."""

    cluster: str
    broker_name: str
    broker_id: int
    register_code: str

    def encode(self) -> str:
        return f"{self.cluster}#{self.broker_name}#{self.broker_id}#{self.register_code}"


def new_register_code(address: str) -> str:
    """A register code unique per attempt: ``address;epoch_ms;random``.

    RocketMQ's controller reads the address as the part before the first ``;``.
    """
    return f"{address};{int(time.time() * 1000)};{secrets.token_hex(4)}"


def _check_name(what: str, value: str) -> None:
    if not value or "#" in value or "\n" in value:
        raise BrokerIdentityError(f"{what} {value!r} cannot be stored in a meta file (empty, '#' or newline)")


def write_atomic(path: Path, text: str, *, failpoint: Failpoint | None = None) -> None:
    """Write ``text`` to ``path`` so a crash leaves the old file or the new one, whole.

    Scratch file in the same directory, fsync, rename over the target, fsync the directory
    (the rename is only durable once the directory entry is).
    """
    scratch = path.with_name(path.name + _SCRATCH_SUFFIX)
    data = text.encode("utf-8")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if failpoint is not None:
        hit(failpoint)
    os.replace(scratch, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_small(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_META_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > _MAX_META_BYTES:
        raise CheckpointError(f"{path}: {len(data)}+ bytes, a meta file is at most {_MAX_META_BYTES}")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 ({exc})") from exc


def _parse_id(path: Path, text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise CheckpointError(f"{path}: broker id {text!r} is not an integer") from exc
    if value < 1:
        raise CheckpointError(f"{path}: broker id {value} is below 1")
    return value


class IdentityStore:
    """Reads and writes the two meta files of one store directory and checks them against config."""

    def __init__(self, store_dir: str | os.PathLike[str], cluster: str, broker_name: str) -> None:
        _check_name("cluster name", cluster)
        _check_name("broker name", broker_name)
        self.dir = Path(store_dir)
        self.cluster = cluster
        self.broker_name = broker_name
        self.meta_path = self.dir / META_FILE
        self.temp_path = self.dir / TEMP_META_FILE

    # --- reading --------------------------------------------------------------------------

    def _check_identity(self, path: Path, cluster: str, broker_name: str) -> None:
        if cluster != self.cluster or broker_name != self.broker_name:
            raise BrokerIdentityError(
                f"{path} says cluster {cluster!r}, broker name {broker_name!r}, but the configuration "
                f"says cluster {self.cluster!r}, broker name {self.broker_name!r}; refusing to start "
                f"under the wrong identity (fix the configuration or use another store directory)"
            )

    def read_meta(self) -> BrokerMeta | None:
        text = _read_small(self.meta_path)
        if text is None:
            return None
        parts = text.split("#")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise CheckpointError(f"{self.meta_path}: expected cluster#broker_name#broker_id, got {text!r}")
        self._check_identity(self.meta_path, parts[0], parts[1])
        return BrokerMeta(parts[0], parts[1], _parse_id(self.meta_path, parts[2]))

    def read_temp(self) -> TempBrokerMeta | None:
        text = _read_small(self.temp_path)
        if text is None:
            return None
        # The register code holds no '#', so exactly four fields.
        parts = text.split("#")
        if len(parts) != 4 or not parts[0] or not parts[1] or not parts[3]:
            raise CheckpointError(
                f"{self.temp_path}: expected cluster#broker_name#broker_id#register_code, got {text!r}"
            )
        self._check_identity(self.temp_path, parts[0], parts[1])
        return TempBrokerMeta(parts[0], parts[1], _parse_id(self.temp_path, parts[2]), parts[3])

    # --- writing --------------------------------------------------------------------------

    def write_temp(self, broker_id: int, register_code: str) -> TempBrokerMeta:
        temp = TempBrokerMeta(self.cluster, self.broker_name, broker_id, register_code)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.temp_path, temp.encode(), failpoint=Failpoint.DURING_TEMP_META_WRITE)
        return temp

    def delete_temp(self) -> None:
        try:
            self.temp_path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.dir)

    def commit_meta(self, broker_id: int) -> BrokerMeta:
        """Turn the applied temp identity into ``.broker.meta``, then drop the temp file.

        Meta first, temp second: a crash between the two leaves both, and start-up prefers
        the meta file (and removes the stale temp file).
        """
        meta = BrokerMeta(self.cluster, self.broker_name, broker_id)
        write_atomic(self.meta_path, meta.encode())
        hit(Failpoint.AFTER_META_WRITTEN)
        self.delete_temp()
        hit(Failpoint.AFTER_TEMP_META_REMOVED)
        return meta

    def clean_scratch(self) -> None:
        """Remove scratch files a crash mid-write left behind (their content never counted)."""
        for path in (self.meta_path, self.temp_path):
            scratch = path.with_name(path.name + _SCRATCH_SUFFIX)
            if scratch.exists():
                log.warning("removing %s left by an interrupted write", scratch)
                scratch.unlink()


class BrokerIdAllocator(Protocol):
    """What the id flow needs from the controller (ControllerClient fits it)."""

    async def get_next_broker_id(self, cluster: str, broker_name: str) -> int: ...

    async def apply_broker_id(
        self, cluster: str, broker_name: str, broker_id: int, register_code: str
    ) -> None:
        """Raise RemoteCommandError(CONTROLLER_BROKER_ID_INVALID) when the id is taken."""
        ...


async def negotiate_broker_id(
    store: IdentityStore,
    controller: BrokerIdAllocator,
    *,
    address: str,
    retry_delay_s: float = 0.5,
    stop: asyncio.Event | None = None,
) -> int:
    """Run the id flow of the module docstring until this broker holds a settled id; return it.

    Transport and not-leader failures are retried with the same files (the controller may
    have committed a request whose answer got lost); only an explicit refusal of the id
    deletes the temp file.
    """
    store.clean_scratch()
    while stop is None or not stop.is_set():
        meta = store.read_meta()
        if meta is not None:
            if store.temp_path.exists():
                # Crash between writing the meta file and deleting the temp one.
                log.info("removing stale %s: %s already settles id %d", store.temp_path, store.meta_path, meta.broker_id)
                store.delete_temp()
            return meta.broker_id
        try:
            temp = store.read_temp()
            if temp is None:
                next_id = await controller.get_next_broker_id(store.cluster, store.broker_name)
                log.info("controller offers broker id %d for %s/%s", next_id, store.cluster, store.broker_name)
                hit(Failpoint.AFTER_GET_NEXT_BROKER_ID)
                temp = store.write_temp(next_id, new_register_code(address))
                hit(Failpoint.AFTER_TEMP_META_WRITTEN)
            else:
                log.info("resuming the application for broker id %d from %s", temp.broker_id, store.temp_path)
            try:
                await controller.apply_broker_id(store.cluster, store.broker_name, temp.broker_id, temp.register_code)
            except RemoteCommandError as exc:
                if exc.code != ResponseCode.CONTROLLER_BROKER_ID_INVALID:
                    raise
                log.warning(
                    "controller refused broker id %d (%s); dropping %s and asking for the next id",
                    temp.broker_id, exc.remark, store.temp_path,
                )
                store.delete_temp()
                continue
            hit(Failpoint.AFTER_APPLY_BROKER_ID)
            settled = store.commit_meta(temp.broker_id)
            log.info("broker id %d settled in %s", settled.broker_id, store.meta_path)
            return settled.broker_id
        except (RemotingError, ControllerError, RemoteCommandError, OSError) as exc:
            # Controller unreachable or busy, or a meta file write failed (disk full): the
            # files on disk still say where we are, so the next round resumes from there.
            log.warning("broker id negotiation failed (%s); retrying in %.1fs", exc, retry_delay_s)
            await asyncio.sleep(retry_delay_s)
    raise BrokerIdentityError("broker id negotiation stopped before an id was settled")

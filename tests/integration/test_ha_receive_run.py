"""The slave's one-call receive run changes nothing but its cost: random reads (plain blocks,
heartbeats, gaps, an epoch change, corrupt records, a torn frame at the end, bad tags) are
applied by a real Receiver on a real store twice, once with the run and once forced down
the general path, and both end the same: the same error or result, the same log byte for
byte, the same epochs, confirm offset and state, and after a read that went through the
same receive buffer.  Lone blocks (live traffic, a run of one) through the reader callback
are stored and acked in its turn, a bad one refused unstored and unacked."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqha.ha import frames
from rmqha.ha.config import HAConfig
from rmqha.ha.frame_mac import FrameMac
from rmqha.ha.link import RecvBuffer
from rmqha.security.identity import Identity
from rmqha.security.link_auth import FrameOpener, FrameSealer, LinkSession
from rmqha.testing.ha import OneReadLink, replica_stores, slave_receive, store_digest

SEG = 1 << 20
CFG = HAConfig(max_frame_bytes=1 << 20)
KEYS = tuple(bytes([i]) * 32 for i in range(4))
KINDS = ["good", "good", "good", "gap", "heartbeat", "new-epoch", "corrupt", "bad-tag"]


def _macs() -> tuple[FrameMac, FrameMac]:
    """A master's and a slave's FrameMac of one link, with fixed keys (each slave built
    from them checks the same tags)."""
    m2s, s2m, blocks_m2s, blocks_s2m = KEYS
    peer = Identity.broker("DefaultCluster", "g", "1")
    master = FrameMac(LinkSession(peer, FrameSealer(m2s, b"M"), FrameOpener(s2m, b"S")), blocks_m2s, blocks_s2m)
    slave = FrameMac(LinkSession(peer, FrameSealer(s2m, b"S"), FrameOpener(m2s, b"M")), blocks_s2m, blocks_m2s)
    return master, slave


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[int, bytes]]]:
    """Records of a reference log (the master's), one per block: (offset, bytes)."""
    with replica_stores(tmp_path_factory.mktemp("ref"), SEG, "ref") as [(rcl, _)]:
        out = []
        for i in range(40):
            start = rcl.max_offset
            rcl.append_batch("run", [bytes([i]) * (100 + 7 * i)])
            out.append((start, bytes(rcl.read(start, rcl.max_offset - start))))
        yield out


def _read(kinds: list[str], records: list[tuple[int, bytes]], torn: int, mac: FrameMac | None) -> bytes:
    """One read's bytes: a frame per kind (tags after each when ``mac``), cut ``torn``
    bytes short at the end."""
    out = bytearray()
    nxt, epoch, estart = 0, 1, 0
    for kind in kinds:
        offset, data = records[nxt] if nxt < len(records) else (records[-1][0] + len(records[-1][1]), b"")
        block, size_data = offset, data
        if kind == "gap":
            block = offset + 1
        elif kind == "heartbeat":
            size_data = b""
        elif kind == "new-epoch":
            epoch, estart = epoch + 1, offset
        elif kind == "corrupt":
            size_data = data[:-1] + bytes([data[-1] ^ 0x5A])
        header = frames.pack_transfer_header(block, estart, offset, len(size_data), epoch)
        tag = mac.block_tag(header, size_data) if mac is not None else b""
        if kind == "bad-tag" and tag:
            tag = tag[:-1] + bytes([tag[-1] ^ 1])
        out += header + size_data + tag
        if kind in ("good", "new-epoch", "bad-tag") and size_data:
            nxt += 1
    return bytes(out[: len(out) - torn] if torn < len(out) else out)


@contextmanager
def _slave(directory: str, mac: FrameMac | None, general: bool) -> Iterator[tuple[Any, ...]]:
    with replica_stores(directory, SEG, "s") as [(scl, sem)]:
        sem.append(1, 0)
        s = slave_receive(scl, sem, CFG, mac=mac)
        if general:
            s.receiver._apply_run = lambda rb: None  # type: ignore[method-assign]
        try:
            yield s.receiver, scl, sem, s.epochs, s.confirm, s.progress
        finally:
            s.epochs.settle_now()


def _outcome(read: bytes, directory: str, authenticated: bool, general: bool) -> tuple[Any, ...]:
    mac = _macs()[1] if authenticated else None
    with _slave(directory, mac, general) as (receiver, scl, sem, epochs, confirm, progress):
        rb = RecvBuffer(1 << 16)
        rb.buf[: len(read)] = read
        rb.end = len(read)
        # The receive buffer only matters when the read went through (an error ends the
        # session, and the buffer with it).
        try:
            result: Any = (receiver._apply_buffered(rb), rb.start, rb.end)
        except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
            result = (type(exc).__name__, str(exc))
        epochs.settle_now()
        return (result, scl.max_offset, store_digest(scl), sem.pairs(), confirm.confirm, progress.state,
                receiver.appender.first_block)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=8), torn=st.integers(0, 120),
       authenticated=st.booleans())
def test_the_run_and_the_general_path_end_the_same(reference: list[tuple[int, bytes]], kinds: list[str], torn: int,
                                                   authenticated: bool) -> None:
    read = _read(kinds, reference, torn, _macs()[0] if authenticated else None)
    with tempfile.TemporaryDirectory() as d:
        run = _outcome(read, os.path.join(d, "run"), authenticated, general=False)
        general = _outcome(read, os.path.join(d, "general"), authenticated, general=True)
    assert run == general


def test_the_comparison_can_fail(reference: list[tuple[int, bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a run that skipped the tag check would store a block whose tag is
    bad, and the comparison sees it."""
    read = _read(["good", "bad-tag"], reference, 0, _macs()[0])
    monkeypatch.setattr(FrameMac, "check_run", lambda self, view, spans: None)
    with tempfile.TemporaryDirectory() as d:
        run = _outcome(read, os.path.join(d, "run"), True, general=False)
        general = _outcome(read, os.path.join(d, "general"), True, general=True)
    assert run != general
    assert general[0][0] == "AuthenticationError"


@pytest.mark.parametrize("authenticated", [True, False], ids=["mac", "bare"])
def test_lone_blocks_through_the_reader_callback(reference: list[tuple[int, bytes]], tmp_path: Any,
                                                 authenticated: bool) -> None:
    """Live traffic, one block a read: each is stored and acked (its end, the epoch; sealed
    when the link has MACs) in the callback's turn; a block whose tag or record is bad is
    refused before a byte of it is stored, and nothing is acked for it."""
    _lone_reads(reference, str(tmp_path), authenticated)


def test_lone_reads_see_a_tag_left_unchecked(reference: list[tuple[int, bytes]], tmp_path: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a callback that skipped the tag check stores and acks the bad
    block, and the checks above fail."""
    monkeypatch.setattr(FrameMac, "check_run", lambda self, view, spans: None)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _lone_reads(reference, str(tmp_path), True)


def _lone_reads(reference: list[tuple[int, bytes]], directory: str, authenticated: bool) -> None:
    master, slave = _macs() if authenticated else (None, None)
    link = OneReadLink()
    with _slave(directory, slave, general=False) as (receiver, scl, _, _, _, progress):
        receiver.link = link
        receiver._acked, receiver._unsent_ack = -1, []
        rb = RecvBuffer(1 << 16)
        for n in range(1, 4):
            link.feed = _read(["good"], reference[n - 1 :], 0, master)
            assert receiver._live_step(rb) is True
            end = reference[n][0]
            assert scl.max_offset == end and progress.callback_blocks == n
            ack = frames.pack_transfer_ack(end, 0, 1)
            sent = link.sent[-1]
            assert len(link.sent) == n and len(sent) == len(ack) + (16 if authenticated else 0)
            assert sent[:8] + sent[16:32] == ack[:8] + ack[16:32]  # all but the timestamp
            if slave is not None:
                master._opener.verify(sent[:32], sent[32:])  # sealed: the master's check passes
        link.feed = _read(["bad-tag" if authenticated else "corrupt"], reference[3:], 0, master)
        with pytest.raises(Exception, match="authentication" if authenticated else "invalid record"):
            receiver._live_step(rb)
        assert scl.max_offset == reference[3][0] and len(link.sent) == 3


@pytest.mark.parametrize("authenticated", [True, False], ids=["mac", "bare"])
def test_a_lone_block_after_an_epoch_change_is_acked_under_the_new_epoch(reference: list[tuple[int, bytes]],
                                                                       tmp_path: Any, authenticated: bool) -> None:
    """The block opening epoch 2 hands the ack to the task (its entry is being written);
    once written, the next lone block's ack carries epoch 2."""
    master, slave = _macs() if authenticated else (None, None)
    link = OneReadLink()
    with _slave(str(tmp_path), slave, general=False) as (receiver, scl, sem, epochs, _, _):
        receiver.link = link
        receiver._acked, receiver._unsent_ack = -1, []
        rb = RecvBuffer(1 << 16)
        link.feed = _read(["new-epoch"], reference, 0, master)
        assert receiver._live_step(rb) is False and link.sent == []
        epochs.settle_now()
        assert sem.last_epoch() == 2
        offset, data = reference[1]
        header = frames.pack_transfer_header(offset, 0, offset, len(data), 2)
        link.feed = header + data + (master.block_tag(header, data) if master is not None else b"")
        assert receiver._live_step(rb) is True
        assert scl.max_offset == reference[2][0]
        assert link.sent[-1][16:32] == frames.pack_transfer_ack(scl.max_offset, 0, 2)[16:32]

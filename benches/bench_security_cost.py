"""What TLS and ACL 1.0 cost a send, per step and per process, in process.

Two groups, speed reported and never asserted (the machine may be shared: compare rows of
one run, never runs of different days):

- **steps** (no socket): the client's signing of an encoded send
  (``Credentials.sign_send_frame``) and the broker's ACL check of a plain send
  (``send_frames.parse_send(..., signed=True)`` then ``SendLane.admits``), each beside the
  way it was done before (``before``: the signed content joined with a copy of the body,
  HMAC keyed on every request; for the client also ``sorted``: keyed once, but the fields
  copied and sorted on every request), for one 1 KiB message and a batch of 32;
- **floor** (``test_crypto_floor``, no socket): what a batch's bytes cost in the ciphers
  and hashes alone, as this machine's Python runs them: ACL 1.0's HMAC-SHA1 over the
  signed fields and body (:class:`~rmqha.security.signature.Sha1Mac`), and the signed
  frame sealed into TLS records and opened again by an ``ssl.SSLObject`` pair over memory
  BIOs (the contexts the processes use, ``rmqha certs dev-cluster`` certificates).  A
  batch's serial path takes the HMAC twice (client, master), a seal and an open per link
  it crosses (client to master, master to each slave); the sum is the least that
  security can add to a batch's time, whatever the code around it does;
- **link** (``test_link_cpu``): a ``BlockingLink`` sending to a real ``RemotingServer`` on a
  uvloop thread whose plain-send handler answers at once (no store), with TLS (mutual,
  enforcing, ``rmqha certs dev-cluster`` certificates) and ACL (the broker's ``AclGuard``, the
  client signing) each off and on, and TLS + ACL both ways (``tls+acl``: the link's TLS in
  memory, a frame's records in one send; ``tls+acl sslsocket``: the ``SSLSocket`` it had
  before, a batch one SSL_write a record).  ``extra_info`` has each side's CPU per send in us (the client's
  thread, the server's loop thread: ``time.thread_time``), medians of alternating rounds.
"""
from __future__ import annotations

import binascii
import hmac
import os
import socket
import ssl
import statistics
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benches.conftest import QUICK, describe
from rmqha._core import load
from rmqha.broker.acl_guard import AclGuard
from rmqha.client.blocking_link import BlockingLink
from rmqha.client.send_request import RequestBuilder, SendRequest
from rmqha.net.client_security import ClientSecurity, Credentials, client_context
from rmqha.net.loop import EventLoopThread
from rmqha.net.server import RemotingServer
from rmqha.protocol.headers import SEND_V2_QUEUE_ID
from rmqha.protocol.message import CompressionType
from rmqha.security import certs
from rmqha.security.acl import AclValidator
from rmqha.security.acl_lane import SendLane
from rmqha.security.identity import Identity, Role
from rmqha.security.signature import ACCESS_KEY, mac_for, signed_content, signed_fields
from rmqha.security.tls import client_context as ssl_client_context
from rmqha.security.tls import server_context as ssl_server_context
from rmqha.testing.tls_keys import client_tls, server_tls

SF = load("send_frames")
BODY = b"x" * 1024
BATCH = 32
ACCESS, SECRET = "bench-producer", "bench-secret-0123456789"
SENDS = {"one": 300 if QUICK else 3000, "batch": 100 if QUICK else 600}
ROUNDS = 2 if QUICK else 5


@pytest.fixture(scope="module")
def files() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        certs.dev_cluster(d / "pki", cluster="C", controllers=1, groups={"g": 1})
        (d / "plain_acl.yml").write_text(
            f"accounts:\n  - accessKey: {ACCESS}\n    secretKey: {SECRET}\n"
            "    defaultTopicPerm: DENY\n    topicPerms: [T=PUB]\n")
        yield d


def _request(kind: str) -> SendRequest:
    builder = RequestBuilder("pg", compress_over_bytes=-1, compression=CompressionType.ZLIB,
                             max_batch_bytes=4 << 20, compress_batches=False)
    if kind == "one":
        return builder.single("T", BODY, 0)
    return next(builder.batches("T", [BODY] * BATCH, 0))


def _header(req: SendRequest) -> dict[str, str]:
    return {**req.header, SEND_V2_QUEUE_ID: "0"}


# --- the replaced ways, for the before rows ----------------------------------------------

_LENGTHS = struct.Struct(">iI")
_EXT_START = b'"extFields":{'


def _sign_before(frame: bytes, fields: dict[str, str], body: bytes) -> bytes:
    """``sign_send_frame`` as it was: content joined with the body, HMAC keyed per call."""
    content = signed_content({**fields, ACCESS_KEY: ACCESS}, body)
    mac = hmac.new(SECRET.encode(), content, "sha1").digest()
    signature = binascii.b2a_base64(mac, newline=False)
    total, ori = _LENGTHS.unpack_from(frame, 0)
    at = frame.find(_EXT_START, 8, 8 + (ori & 0xFFFFFF)) + len(_EXT_START)
    ours = b'"%s":"%s","Signature":"%s",' % (ACCESS_KEY.encode(), ACCESS.encode(), signature)
    return b"".join([_LENGTHS.pack(total + len(ours), ori + len(ours)), frame[8:at], ours,
                     frame[at:]])


def _sign_sorted(frame: bytes, fields: dict[str, str], body: bytes) -> bytes:
    """``sign_send_frame`` of the first pass: keyed once, body hashed in place, but the
    fields copied with ``AccessKey`` and sorted on every request."""
    signature = mac_for(SECRET).base64(signed_fields({**fields, ACCESS_KEY: ACCESS}), body)
    total, ori = _LENGTHS.unpack_from(frame, 0)
    at = frame.find(_EXT_START, 8, 8 + (ori & 0xFFFFFF)) + len(_EXT_START)
    ours = b'"%s":"%s","Signature":"%s",' % (ACCESS_KEY.encode(), ACCESS.encode(), signature)
    return b"".join([_LENGTHS.pack(total + len(ours), ori + len(ours)), frame[8:at], ours,
                     frame[at:]])


def _check_before(raw: bytes) -> bool:
    """The lane's check as it was: the fields and a copy of the body, HMAC keyed per call."""
    send = SF.parse_send(raw, (), True)
    assert send is not None and send[14] is not None and send[13] is not None
    mac = hmac.digest(SECRET.encode(), send[14] + send[10], "sha1")
    return hmac.compare_digest(binascii.b2a_base64(mac, newline=False), send[13])


# --- steps ---------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["before", "sorted", "after"])
@pytest.mark.parametrize("kind", ["one", "batch"])
def test_client_signing(benchmark: Any, kind: str, impl: str) -> None:
    req = _request(kind)
    frame, fields = req.frame(7, 0), _header(req)
    creds = Credentials(ACCESS, SECRET)
    ways: dict[str, Callable[[], bytes | None]] = {
        "after": lambda: creds.sign_send_frame(frame, fields, req.body),
        "sorted": lambda: _sign_sorted(frame, fields, req.body),
        "before": lambda: _sign_before(frame, fields, req.body)}
    sign = ways[impl]
    assert sign() == creds.sign_send_frame(frame, fields, req.body)  # the same bytes
    describe(benchmark, impl, message_bytes=len(BODY), batch=BATCH if kind == "batch" else 1)
    benchmark(sign)


@pytest.mark.parametrize("impl", ["before", "after"])
@pytest.mark.parametrize("kind", ["one", "batch"])
def test_broker_acl_check(benchmark: Any, files: Path, kind: str, impl: str) -> None:
    req = _request(kind)
    signed = Credentials(ACCESS, SECRET).sign_send_frame(req.frame(7, 0), _header(req), req.body)
    assert signed is not None
    raw = signed[4:]
    lane, state = SendLane(AclValidator(files / "plain_acl.yml")), {}  # type: ignore[var-annotated]

    def after() -> bool:
        send = SF.parse_send(raw, (), True)
        assert send is not None
        return lane.admits(send[12], send[3], send[13], send[14], send[10], state, "127.0.0.1")

    check = after if impl == "after" else (lambda: _check_before(raw))
    assert check()
    describe(benchmark, impl, message_bytes=len(BODY), batch=BATCH if kind == "batch" else 1)
    benchmark(check)


# --- floor: the ciphers and hashes alone ----------------------------------------------------


class _MemoryPair:
    """A client and a server ``SSLObject`` over memory BIOs, the handshake done."""

    def __init__(self, pki: Path) -> None:
        broker = Identity.broker("C", "g", "g-0")
        server = ssl_server_context(server_tls(pki, broker))
        client = ssl_client_context(client_tls(pki, Identity.client("client")))
        self.c_in, self.c_out, self.s_in, self.s_out = (ssl.MemoryBIO() for _ in range(4))
        self.client = client.wrap_bio(self.c_in, self.c_out)
        self.server = server.wrap_bio(self.s_in, self.s_out, server_side=True)
        for _ in range(10):
            for side in (self.client, self.server):
                try:
                    side.do_handshake()
                except ssl.SSLWantReadError:
                    pass
            self.s_in.write(self.c_out.read())
            self.c_in.write(self.s_out.read())
        assert self.client.version() == self.server.version() == "TLSv1.3"

    def seal(self, plain: bytes) -> bytes:
        self.client.write(plain)
        return self.c_out.read()

    def round_trip(self, plain: bytes) -> int:
        """``plain`` sealed by the client and opened by the server: bytes opened."""
        self.s_in.write(self.seal(plain))
        opened = 0
        while True:
            try:
                opened += len(self.server.read(64 * 1024))
            except ssl.SSLWantReadError:
                return opened


@pytest.mark.parametrize("step", ["hmac_sha1", "tls_seal", "tls_seal_and_open"])
def test_crypto_floor(benchmark: Any, files: Path, step: str) -> None:
    req = _request("batch")
    frame = Credentials(ACCESS, SECRET).sign_send_frame(req.frame(7, 0), _header(req), req.body)
    assert frame is not None
    mac, fields = mac_for(SECRET), signed_fields({**_header(req), ACCESS_KEY: ACCESS})
    pair = _MemoryPair(files / "pki")
    ways: dict[str, Callable[[], object]] = {
        "hmac_sha1": lambda: mac.digest(fields, req.body),
        "tls_seal": lambda: pair.seal(frame),
        "tls_seal_and_open": lambda: pair.round_trip(frame)}
    if step == "tls_seal_and_open":
        assert pair.round_trip(frame) == len(frame)
    describe(benchmark, step, message_bytes=len(BODY), batch=BATCH, frame_bytes=len(frame),
             cipher=pair.client.cipher()[0])  # type: ignore[index]
    benchmark(ways[step])


# --- link: each side's CPU per send ---------------------------------------------------------


class _SslSocketLink(BlockingLink):
    """The TLS link as it was: an ``SSLSocket`` told it is non-blocking (timeout 0) on a
    blocking descriptor, a frame of several records one SSL_write a record under
    SO_SNDTIMEO, an answer one SSL_read.  (An SSL_read that gives up on a record without
    data, a session ticket, is retried here, which that link did not do.)"""

    _ssl: ssl.SSLSocket

    def _connect(self, deadline: float) -> socket.socket:
        super()._connect(deadline)
        self._sock = self._ssl
        return self._ssl

    def _handshake(self, sock: socket.socket, context: ssl.SSLContext,
                   deadline: float) -> Any:
        self._ssl = context.wrap_socket(sock, server_hostname=self.host)
        self._ssl.settimeout(0)
        os.set_blocking(self._ssl.fileno(), True)
        return None  # no MemoryTls: _send and _read below speak through the SSLSocket

    def _send(self, sock: socket.socket, frame: bytes, deadline: float) -> None:
        view = memoryview(frame)
        sent = 0
        while sent < len(frame):
            self._arm(sock, deadline)
            sent += sock.send(view[sent:sent + _TLS_RECORD])

    def _read(self, sock: socket.socket, deadline: float) -> bytes:
        while True:
            self._arm(sock, deadline)
            try:
                return sock.recv(64 * 1024)
            except ssl.SSLWantReadError:
                continue


_TLS_RECORD = 16 * 1024


class _Server:
    """A RemotingServer on its own uvloop thread answering plain sends at once."""

    def __init__(self, files: Path, tls: bool, acl: bool) -> None:
        broker = next(i for i in certs.dev_cluster_identities(
            cluster="C", controllers=1, groups={"g": 1}, namesrv=1) if i.role is Role.BROKER)
        self.thread = EventLoopThread("bench-security-server")
        self.server = RemotingServer(tls=server_tls(files / "pki", broker) if tls else None)
        self.server.dispatcher.register_plain_send(self._answer, ())
        if acl:
            guard = AclGuard(files / "plain_acl.yml")
            self.server.dispatcher.guard = guard
            self.server.dispatcher.plain_guard = guard.plain
        self.thread.run(self.server.start())

    @staticmethod
    def _answer(send: Any, conn: Any) -> bool:
        conn.answer_frame(SF.encode_send_ok(send[2], send[1], 0, "00" * 16, 0, 0, "SEND_OK", 0))
        return True

    def cpu(self) -> float:
        async def now() -> float:
            return time.thread_time()
        return self.thread.run(now())

    def stop(self) -> None:
        self.thread.run(self.server.stop())
        self.thread.stop()


def _side_cpu(files: Path, kind: str, tls: bool, acl: bool, link_cls: type[BlockingLink],
              n: int) -> tuple[float, float]:
    """(client, server) CPU us per send over one fresh connection."""
    server = _Server(files, tls, acl)
    context = client_context(client_tls(files / "pki", Identity.client("client"))) if tls else None
    creds = Credentials(ACCESS, SECRET) if acl else None
    security = (ClientSecurity(context, creds.sign if creds else None, credentials=creds)
                if tls or acl else None)
    link = link_cls(server.server.address, security=security)
    reqs = [_request(kind) for _ in range(n)]
    try:
        for r in reqs[:20]:
            _send(link, r)
        c0, s0 = time.thread_time(), server.cpu()
        for r in reqs:
            _send(link, r)
        c1, s1 = time.thread_time(), server.cpu()
    finally:
        link.close()
        server.stop()
    return (c1 - c0) / n * 1e6, (s1 - s0) / n * 1e6


def _send(link: BlockingLink, req: SendRequest) -> None:
    opaque = next(_OPAQUES)
    frame = req.frame(opaque, 0)
    if link.signs:
        signed = link.signed(frame, _header(req), req.body)
        assert signed is not None
        frame = signed
    answer = link.send(frame, opaque, 5.0)
    assert answer[0] == 0, answer


def _opaques() -> Iterator[int]:
    n = 0
    while True:
        n += 1
        yield n


_OPAQUES = _opaques()

CASES = [("plain", False, False, BlockingLink), ("tls", True, False, BlockingLink),
         ("acl", False, True, BlockingLink), ("tls+acl", True, True, BlockingLink),
         ("tls+acl sslsocket", True, True, _SslSocketLink)]


@pytest.mark.parametrize("kind", ["one", "batch"])
def test_link_cpu(benchmark: Any, files: Path, kind: str) -> None:
    cases = CASES
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in cases}

    def run() -> None:
        for r in range(ROUNDS):
            for name, tls, acl, cls in (cases if r % 2 == 0 else cases[::-1]):
                got[name].append(_side_cpu(files, kind, tls, acl, cls, SENDS[kind]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    describe(benchmark, "uvloop", message_bytes=len(BODY), batch=BATCH if kind == "batch" else 1)
    for name, rows in got.items():
        benchmark.extra_info[f"{name}.client_cpu_us"] = round(statistics.median(c for c, _ in rows), 1)
        benchmark.extra_info[f"{name}.server_cpu_us"] = round(statistics.median(s for _, s in rows), 1)

"""HA link authentication: the wire as documented, who is let in, and the config keys.

* The wire: a client written from the documentation of rmqha.ha.auth and rmqha.ha.frame_mac
  alone (the link_auth building block, ``struct``, ``hashlib``, ``cryptography``) replicates from a real
  master: it checks every tag the master sends and the master counts its sealed acks.
* Who: the same secret but another group or cluster is refused by the master (one log
  line, no link); a master of another group is refused by the slave before the slave's
  proof goes out; a wrong secret fails on both sides; a slave that authenticates meets a
  master without a secret, and the other way round.  Each refusal has its control: the
  same pair with matching settings replicates (the helpers' default, used everywhere).
* Config: ``cluster_secret`` / ``clusterSecret``, ``cluster_secret_file``,
  ``RMQHA_CLUSTER_SECRET``, ``ha_allow_unauthenticated_rocketmq_dialect``.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rmqha.broker.config import BrokerConfig
from rmqha.config import load_config
from rmqha.errors import ConfigError
from rmqha.ha import HAAuth
from rmqha.security.identity import Identity
from rmqha.security.link_auth import Handshake, LinkSession
from rmqha.security.secret import ClusterSecret, write_secret_file
from rmqha.testing.ha import (
    CLUSTER,
    GROUP,
    TEST_SECRET,
    assert_same_log,
    auth_for,
    fast_config,
    fill,
    ha_master,
    ha_slave,
    master_running,
    replica_stores,
    slave_running,
    wait_until_async,
)
from rmqha.testing.sealed_script import recv_exactly

SEG = 1 << 20
CFG = fast_config(ha_housekeeping_interval_ms=2000, ha_reconnect_min_ms=50)
OTHER = ClusterSecret(b"another-cluster-secret-0123456789", "test")


# --- the wire, from the documentation --------------------------------------------------------------


class _Link:
    """The client's end of an authenticated link: the link_auth session and, per
    direction, the GMAC key and count of blocks."""

    def __init__(self, session: LinkSession, keys: bytes) -> None:
        self.session = session
        self.gmac = {"out": AESGCM(keys[:32]), "in": AESGCM(keys[32:])}
        self.blocks = {"out": 0, "in": 0}

    def mac_input(self, frame: bytes, way: str) -> bytes:
        """The frame, or for TRANSFER_DATA (type 6) its 48-byte header || GMAC(data)."""
        if struct.unpack_from(">i", frame, 4)[0] != 6:
            return frame
        nonce = bytes(4) + self.blocks[way].to_bytes(8, "big")
        self.blocks[way] += 1
        return frame[:48] + self.gmac[way].encrypt(nonce, b"", frame[48:])


SLAVE_2 = Identity.broker(CLUSTER, GROUP, "2")


def _handshake(sock: socket.socket, who: Identity = SLAVE_2) -> _Link:
    """PREFACE || u16 len || HELLO; u16 len || SERVER_AUTH; u16 len || CLIENT_AUTH; the
    block keys from the secret and the first two messages."""
    hs = Handshake.client(TEST_SECRET, who, context="ha")
    hello = hs.start()
    assert hello is not None
    sock.sendall(b"\x80rHA" + struct.pack(">H", len(hello)) + hello)
    (n,) = struct.unpack(">H", recv_exactly(sock, 2))
    answer = recv_exactly(sock, n)
    proof = hs.receive(answer)
    assert proof is not None
    sock.sendall(struct.pack(">H", len(proof)) + proof)
    salt = hashlib.sha256(struct.pack(">H", len(hello)) + hello + struct.pack(">H", n) + answer).digest()
    keys = HKDF(algorithm=hashes.SHA256(), length=64, salt=salt,
                info=b"rmqha ha block keys v1").derive(TEST_SECRET.reveal())
    return _Link(hs.session(), keys)


def _send(sock: socket.socket, link: _Link, ftype: int, payload: bytes) -> None:
    frame = struct.pack(">iiqq", 24 + len(payload), ftype, 0, -1) + payload
    sock.sendall(frame + link.session.sealer.tag(link.mac_input(frame, "out")))


def _recv_frame(sock: socket.socket, link: _Link) -> bytes:
    (length,) = struct.unpack(">i", head := recv_exactly(sock, 4))
    frame = head + recv_exactly(sock, length - 4)
    link.session.opener.verify(link.mac_input(frame, "in"), recv_exactly(sock, 16))
    return frame


def test_a_client_written_from_the_documented_wire_replicates_and_is_acked(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        end = fill(mcl, 600_000)

        def client(sock: socket.socket) -> bytes:
            link = _handshake(sock)
            address = b"127.0.0.1:1"
            _send(sock, link, 1, struct.pack(">iqqi", 0, 2, SEG, len(address)) + address)
            hello = _recv_frame(sock, link)
            # HANDSHAKE_MASTER (type 2), check_result 0: accepted
            assert (struct.unpack_from(">i", hello, 4)[0], struct.unpack_from(">i", hello, 24)[0]) == (2, 0)
            _send(sock, link, 3, b"")
            assert struct.unpack_from(">i", _recv_frame(sock, link), 4)[0] == 4  # RETURN_EPOCH
            _send(sock, link, 5, struct.pack(">q", 0))
            log = bytearray()
            while len(log) < end:
                frame = _recv_frame(sock, link)  # every tag checks, heartbeats included
                log += frame[48:]
            _send(sock, link, 7, struct.pack(">q", len(log)))
            return bytes(log)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0)
            async with master_running(m) as port:
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    log = await asyncio.get_running_loop().run_in_executor(None, client, sock)
                    assert log == bytes(mcl.read(0, end))
                    assert await m.sync.wait_for_acks(end, None, timeout=5)  # the sealed ack counted

        asyncio.run(run())


# --- who is let in ------------------------------------------------------------------------------


def _pair(tmp_path, caplog, master_auth: Any, slave_auth: Any, *, slave_error: str, master_log: str) -> None:
    """A master and slave 2 that must not replicate: the slave's error and the master's one
    refusal line say why, and the master holds no link."""
    caplog.set_level(logging.INFO, logger="rmqha.ha")
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG, auth=master_auth)
            async with master_running(m) as port, \
                    slave_running(ha_slave(scl, sem, port, CFG, auth=slave_auth)) as s:
                await wait_until_async(lambda: bool(s.last_error) and slave_error in s.last_error, 10,
                                       f"slave error {slave_error!r}")
                await wait_until_async(lambda: any(master_log in r.getMessage() for r in caplog.records), 5,
                                       f"master log {master_log!r}")
                assert m.status()["slaves"] == [] and scl.max_offset == 0

        asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if r.name == "rmqha.ha.master" and "refusing" in r.getMessage()]
    assert lines and all("refusing HA link from 127.0.0.1:" in line for line in lines), lines


@pytest.mark.parametrize("who", [Identity.broker(CLUSTER, "another-group", "2"),
                                 Identity.broker("another-cluster", GROUP, "2")], ids=["group", "cluster"])
def test_master_refuses_a_broker_of_another_group_or_cluster(tmp_path, caplog, who: Identity) -> None:
    """With the secret but another identity (a client that does not check the master's):
    the master closes after the handshake, before the hello, and logs why."""
    caplog.set_level(logging.INFO, logger="rmqha.ha.master")
    what = "group" if who.group != GROUP else "cluster"
    with replica_stores(tmp_path, SEG, "m") as [(mcl, mem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)

        def client(sock: socket.socket) -> bytes:
            link = _handshake(sock, who)
            try:
                _send(sock, link, 1, struct.pack(">iqqi", 0, 2, SEG, 0) + struct.pack(">q", 0))
            except (BrokenPipeError, ConnectionResetError):
                pass
            sock.settimeout(5)
            got = b""
            try:
                while chunk := sock.recv(1 << 16):
                    got += chunk
            except ConnectionResetError:
                pass
            return got

        async def run() -> None:
            m = ha_master(mcl, mem, CFG)
            async with master_running(m) as port:
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    me = "%s:%d" % sock.getsockname()[:2]
                    assert await asyncio.get_running_loop().run_in_executor(None, client, sock) == b""
                assert m.status()["slaves"] == []
                lines = [r.getMessage() for r in caplog.records if me in r.getMessage()]
                assert len(lines) == 1 and f"not a broker of {what}" in lines[0], lines

        asyncio.run(run())


@dataclass(frozen=True)
class _LooseGroup(HAAuth):
    """An identity of another group than the HA object it is given to (HAMaster and HASlave
    check they agree; a misconfigured or hostile peer need not)."""

    def check_group(self, group: str) -> None:
        pass


def test_slave_refuses_a_master_of_another_group_before_proving_itself(tmp_path, caplog) -> None:
    master = _LooseGroup(TEST_SECRET, Identity.broker(CLUSTER, "another-group", "1"))
    _pair(tmp_path, caplog, master, auth_for(2), slave_error="not a broker of group",
          master_log="closed the link")


def test_wrong_secret_fails_on_both_sides(tmp_path, caplog) -> None:
    _pair(tmp_path, caplog, auth_for(1), auth_for(2, OTHER), slave_error="server's proof is wrong",
          master_log="refusing HA link")


def test_authenticating_slave_and_master_without_a_secret(tmp_path, caplog) -> None:
    _pair(tmp_path, caplog, None, auth_for(2), slave_error="master closed the link during authentication",
          master_log="this master has no cluster secret")


def test_slave_without_a_secret_and_master_with_one(tmp_path, caplog) -> None:
    _pair(tmp_path, caplog, auth_for(1), None, slave_error="",  # closed or reset: it cannot know why
          master_log="unauthenticated framed-dialect hello")


def test_control_matching_settings_replicate(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        fill(mcl, 100_000)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG)
            async with master_running(m) as port, slave_running(ha_slave(scl, sem, port, CFG)) as s:
                await wait_until_async(lambda: scl.max_offset == mcl.max_offset, 10, "replicated")
                assert s.last_error == "" and s.status()["authenticated"]
                assert m.status()["slaves"][0]["identity"] == f"rmqha:broker/{CLUSTER}/{GROUP}/2"

        asyncio.run(run())
        assert_same_log(mcl, scl)


def test_rocketmq_dialect_slave_with_a_secret_needs_the_explicit_allowance(tmp_path) -> None:
    with replica_stores(tmp_path, SEG, "s") as [(scl, sem)]:
        with pytest.raises(ConfigError, match="ha_allow_unauthenticated_rocketmq_dialect"):
            ha_slave(scl, sem, 1, CFG, protocol="rocketmq", auth=auth_for(2, allow_rocketmq=False))
        ha_slave(scl, sem, 1, CFG, protocol="rocketmq", auth=auth_for(2, allow_rocketmq=True))  # allowed
        with pytest.raises(ConfigError, match="not of broker group"):
            ha_slave(scl, sem, 1, CFG, auth=HAAuth(TEST_SECRET, Identity.broker(CLUSTER, "other", "2")))


# --- configuration ------------------------------------------------------------------------------


def _config(env: dict[str, str] | None = None, **values: Any) -> BrokerConfig:
    return load_config(BrokerConfig, env=env or {}, overrides={"controller_addr": ["127.0.0.1:1"], **values})


@pytest.fixture(autouse=True)
def _no_secret_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RMQHA_CLUSTER_SECRET", raising=False)
    monkeypatch.delenv("RMQHA_CLUSTER_SECRET_FILE", raising=False)


def test_broker_config_secret_keys(tmp_path) -> None:
    assert _config().load_cluster_secret() is None
    value = "s" * 32
    cfg = _config(cluster_secret=value)
    assert cfg.load_cluster_secret() == ClusterSecret(value.encode(), "x")
    assert value not in repr(cfg)
    assert _config(clusterSecret=value).load_cluster_secret() is not None
    path = write_secret_file(tmp_path / "cluster.secret", "f" * 32)
    assert _config(cluster_secret_file=str(path)).load_cluster_secret() == ClusterSecret(b"f" * 32, "x")
    from_env = _config(env={"RMQHA_CLUSTER_SECRET": "e" * 32})
    assert from_env.load_cluster_secret() == ClusterSecret(b"e" * 32, "x")


def test_broker_config_refuses_what_a_secret_cannot_protect() -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        _config(cluster_secret="short")
    with pytest.raises(ConfigError, match="does not exist"):
        _config(cluster_secret_file="/nonexistent/cluster.secret")
    with pytest.raises(ConfigError, match="ha_allow_unauthenticated_rocketmq_dialect"):
        _config(cluster_secret="s" * 32, ha_protocol="rocketmq")
    _config(cluster_secret="s" * 32, ha_protocol="rocketmq", ha_allow_unauthenticated_rocketmq_dialect=True)
    with pytest.raises(ConfigError, match="identity"):
        _config(cluster_secret="s" * 32, broker_name="broker a")  # no space in an identity
    _config(ha_protocol="rocketmq", broker_name="broker a")  # no secret: as before

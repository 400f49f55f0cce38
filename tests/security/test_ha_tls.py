"""The HA link over mutual TLS (:mod:`rmqha.ha.tls_link`), with in-process masters and slaves.

Certificates come from ``rmqha certs dev-cluster`` (:func:`rmqha.security.certs.dev_cluster`)
for cluster ``DefaultCluster``, group ``g`` (the HA helpers' group) and a group ``other``;
plus a foreign CA's and expired certificates of the same identities.

- a master and two slaves over TLS replicate (bulk catch-up and live messages), every send
  acknowledged with three copies, the messages read back from a slave's log;
- what a relay between slave and master forwards holds no message body (the negative
  control: the same relay on a plaintext link does see it);
- slaves with a certificate of another group, of a client or a controller, from another
  CA, expired, without a certificate, or in plaintext are refused: one log line each
  naming why, no byte of the log (their logs stay empty, they never see the master's
  hello), and the real slave's link, acks and the SyncStateSet do not change;
- a master whose certificate names another group cannot make a slave replicate.

The refusal tests run without a cluster secret, so TLS is the only guard.  With a secret,
frames over TLS carry no MAC (:mod:`rmqha.ha.auth`), so the secret's handshake is what is
left on top of TLS:

- a slave with a good certificate but without the secret, or with a wrong one, gets
  nothing (the control: the right secret replicates);
- a relay holding a stolen broker key, which terminates TLS towards both ends and forwards
  the secret's handshake, gets nothing either: the proofs are bound to each TLS session
  (the control: with the binding switched off, the same relay carries the log in the clear,
  free to alter it).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from rmqha.errors import ConfigError
from rmqha.ha import HAMaster, HASlave
from rmqha.ha.link import Link, LinkClosed, LinkTimeout, connect
from rmqha.ha.tls_link import HATls, TlsLink
from rmqha.protocol.message import decode_records
from rmqha.security import certs
from rmqha.security.identity import Identity
from rmqha.security.secret import ClusterSecret
from rmqha.security.tls import ClientAuth, ReloadingContext, TlsMode, TlsSettings
from rmqha.store import CommitLog
from rmqha.testing.ha import (
    CLUSTER,
    GROUP,
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
from rmqha.testing.tls_keys import server_tls

SEG = 1 << 20
CFG = fast_config(ha_housekeeping_interval_ms=2000, ha_reconnect_min_ms=50)
MARK = b"HA-TLS-PROBE-BODY"
MASTER, SLAVE, SLAVE_3 = (Identity.broker(CLUSTER, GROUP, f"{GROUP}-{i}") for i in range(3))
OTHER_GROUP = Identity.broker(CLUSTER, "other", "other-0")
WRONG = ClusterSecret(b"not-the-cluster-secret-at-all-0123", "the impostor")


class Keys:
    """The three certificate directories (see the module docstring)."""

    def __init__(self, base: Path) -> None:
        self.good, self.foreign, self.expired = base / "good", base / "foreign", base / "expired"
        groups = {GROUP: 3, "other": 1}
        certs.dev_cluster(self.good, cluster=CLUSTER, controllers=1, groups=groups, namesrv=0)
        certs.dev_cluster(self.foreign, cluster=CLUSTER, controllers=1, groups=groups, namesrv=0)
        self.expired.mkdir()
        for name in (certs.CA_CERT, certs.CA_KEY):
            (self.expired / name).write_bytes((self.good / name).read_bytes())
        certs.issue(self.expired, SLAVE, days=1, now=dt.datetime.now(dt.UTC) - dt.timedelta(days=30))

    def settings(self, identity: Identity, where: Path | None = None,
                 mode: TlsMode = TlsMode.ENFORCING) -> TlsSettings:
        """A broker's TLS settings: ``identity``'s pair from ``where``, trusting the good CA;
        the client port asks for no client certificate (the HA port always does)."""
        return server_tls(where or self.good, identity, self.good / certs.CA_CERT, mode=mode,
                          client_auth=ClientAuth.NONE)

    def ha(self, identity: Identity, where: Path | None = None) -> HATls:
        tls = HATls.from_settings(self.settings(identity, where), CLUSTER, GROUP)
        assert tls is not None
        return tls

    def without_certificate(self) -> HATls:
        """A slave that trusts the CA but presents no certificate."""
        good = self.ha(SLAVE)
        bare = TlsSettings(client_trust_cert_path=str(self.good / certs.CA_CERT))
        return HATls(good.server, ReloadingContext.client(bare), CLUSTER, GROUP)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("ha-tls-keys"))


def _append_marked(cl: CommitLog, count: int, start: int = 0) -> int:
    cl.append_batch("secrets", [MARK + b"-%08d" % (start + i) for i in range(count)])
    return cl.max_offset


def _bodies(cl: CommitLog, start: int) -> list[bytes]:
    """The bodies from ``start`` to the log's end (within one segment)."""
    return [m.body for m in decode_records(cl.read(start, cl.max_offset - start))]


# --- a relay that keeps what it forwards ---------------------------------------------------------


@asynccontextmanager
async def recording_relay(port: int) -> AsyncIterator[tuple[int, bytearray]]:
    """A TCP relay to 127.0.0.1:``port`` on this loop; yields its port and every byte it
    forwarded either way."""
    seen = bytearray()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                seen.extend(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], seen
    finally:
        server.close()


# --- replication ---------------------------------------------------------------------------------


def test_three_copies_over_tls_and_the_messages_read_back_from_a_slave(tmp_path, keys: Keys) -> None:
    with replica_stores(tmp_path, SEG, "m", "s2", "s3") as [(mcl, mem), (s2, em2), (s3, em3)]:
        mem.append(1, 0)
        fill(mcl, 3 * SEG // 2)  # bulk catch-up first, across a segment end
        bulk = mcl.max_offset

        async def run() -> None:
            m = ha_master(mcl, mem, CFG, known=(2, 3), sync_state_set=[1, 2, 3], sync_state_set_epoch=1,
                          confirm_offset=0, tls=keys.ha(MASTER))
            async with master_running(m) as port, \
                    slave_running(ha_slave(s2, em2, port, CFG, tls=keys.ha(SLAVE))) as a, \
                    slave_running(ha_slave(s3, em3, port, CFG, broker_id=3, tls=keys.ha(SLAVE_3))):
                assert await m.sync.wait_for_acks(bulk, None, timeout=20)
                for i in range(50):  # live: one acknowledged send at a time
                    assert await m.sync.wait_for_acks(_append_marked(mcl, 1, i), None, timeout=5)
                end = _append_marked(mcl, 2000, 50)  # and a burst
                assert await m.sync.wait_for_acks(end, None, timeout=10)
                links = sorted(m.status()["slaves"], key=lambda s: s["broker_id"])
                assert [(s["tls"], s["certificate"], s["identity"], s["ack_offset"]) for s in links] == [
                    (True, str(SLAVE), f"rmqha:broker/{CLUSTER}/{GROUP}/2", end),
                    (True, str(SLAVE_3), f"rmqha:broker/{CLUSTER}/{GROUP}/3", end)]
                assert a.status()["tls"]
                # Both receive paths ran over TLS: large blocks straight into the log, live
                # blocks in the reader callback.
                assert a.direct_receives > 0 and a.callback_blocks > 0
                await wait_until_async(lambda: a.confirm_offset == end, 5, "the slave learning the confirm offset")

        asyncio.run(run())
        for replica in (s2, s3):
            assert replica.max_offset == mcl.max_offset
            marked = _bodies(replica, bulk)
            assert marked == [MARK + b"-%08d" % i for i in range(2050)]


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plaintext-control"])
def test_a_relay_between_slave_and_master_sees_no_message_body(tmp_path, keys: Keys, tls: bool) -> None:
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        _append_marked(mcl, 100)

        async def run() -> bytes:
            m = ha_master(mcl, mem, CFG, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0,
                          tls=keys.ha(MASTER) if tls else None)
            async with master_running(m) as port, recording_relay(port) as (relay, seen), \
                    slave_running(ha_slave(scl, sem, relay, CFG, tls=keys.ha(SLAVE) if tls else None)):
                assert await m.sync.wait_for_acks(mcl.max_offset, None, timeout=10)
                assert await m.sync.wait_for_acks(_append_marked(mcl, 1, 100), None, timeout=5)
                return bytes(seen)

        seen = asyncio.run(run())
        assert scl.max_offset == mcl.max_offset and len(seen) > 100 * len(MARK)
        # The secret (held in both runs) authenticates the link; only TLS hides the bodies.
        assert (MARK in seen) is not tls


# --- refused slaves ------------------------------------------------------------------------------


#: How each impostor dials (None: plaintext) and what the master's refusal line says.
IMPOSTORS: dict[str, tuple[Callable[[Keys], HATls | None], str]] = {
    "other-group": (lambda k: k.ha(OTHER_GROUP), "names rmqha:broker/DefaultCluster/other/other-0"),
    "client-role": (lambda k: k.ha(Identity.client("client")), "names rmqha:client/client"),
    "controller-role": (lambda k: k.ha(Identity.controller("n0")), "names rmqha:controller/n0"),
    "foreign-ca": (lambda k: k.ha(SLAVE, k.foreign), "certificate verify failed"),
    "expired": (lambda k: k.ha(SLAVE, k.expired), "certificate verify failed"),
    "no-certificate": (lambda k: k.without_certificate(), "TLS handshake failed"),
    "plaintext": (lambda k: None, "TLS only"),
}


@asynccontextmanager
async def replicating(tmp_path: Path, keys: Keys, secret: bool = False,
                      ) -> AsyncIterator[tuple[HAMaster, HASlave, CommitLog]]:
    """A TLS master (with the cluster secret or without) and its real slave 2, caught up."""
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        _append_marked(mcl, 500)
        m = ha_master(mcl, mem, CFG, known=(2, 3), sync_state_set=[1, 2], sync_state_set_epoch=1,
                      confirm_offset=0, auth=auth_for(1) if secret else None, tls=keys.ha(MASTER))
        async with master_running(m) as port, \
                slave_running(ha_slave(scl, sem, port, CFG, auth=auth_for(2) if secret else None,
                                       tls=keys.ha(SLAVE))) as s:
            assert await m.sync.wait_for_acks(mcl.max_offset, None, timeout=10)
            yield m, s, mcl


@pytest.mark.parametrize("case", sorted(IMPOSTORS))
def test_a_slave_without_a_certificate_of_this_group_is_refused_and_gets_nothing(tmp_path, caplog, keys: Keys,
                                                                                 case: str) -> None:
    dial, why = IMPOSTORS[case]
    caplog.set_level(logging.INFO, logger="rmqha.ha.master")

    def refusals() -> list[str]:
        return [r.getMessage() for r in caplog.records if "refusing HA link" in r.getMessage()]

    async def run() -> None:
        async with replicating(tmp_path / "pair", keys) as (m, real, mcl):
            [before] = m.status()["slaves"]
            sessions, ids = real.sessions, (m.sync_state_set, m.sync_state_set_epoch)
            with replica_stores(tmp_path, SEG, "impostor") as [(icl, iem)]:
                # It claims the real slave's id: admitted, it would take over its link.
                impostor = ha_slave(icl, iem, int(m.address.rpartition(":")[2]), CFG, auth=None, tls=dial(keys))
                async with slave_running(impostor):
                    # Refused on every retry; the refusals of one kind are logged once a period.
                    await wait_until_async(lambda: m.refused_links >= 2 and len(refusals()) >= 1, 10,
                                           "the impostor refused twice")
                    end = _append_marked(mcl, 20, 1000)
                    assert await m.sync.wait_for_acks(end, None, timeout=5)
                    assert (icl.max_offset, impostor.master_max_offset) == (0, -1)
                    assert impostor.last_error
            [link] = m.status()["slaves"]
            assert (link["address"], link["ack_offset"], link["certificate"]) == (before["address"], end, str(SLAVE))
            assert (real.sessions, m.sync_state_set, m.sync_state_set_epoch) == (sessions, *ids)

    asyncio.run(run())
    lines = refusals()
    assert all(why in line for line in lines), lines
    assert all(line.count("\n") == 0 for line in lines)


def test_a_master_with_a_certificate_of_another_group_cannot_feed_a_slave(tmp_path, caplog, keys: Keys) -> None:
    caplog.set_level(logging.INFO, logger="rmqha.ha.slave")
    with replica_stores(tmp_path, SEG, "fake", "s") as [(fcl, fem), (scl, sem)]:
        fem.append(1, 0)
        _append_marked(fcl, 100)
        # It admits the slave (its check is for group g), but its own certificate is other's.
        fake = ha_master(fcl, fem, CFG, auth=None, tls=keys.ha(OTHER_GROUP))

        async def run() -> None:
            async with master_running(fake) as port, \
                    slave_running(ha_slave(scl, sem, port, CFG, auth=None, tls=keys.ha(SLAVE))) as s:
                await wait_until_async(lambda: s.sessions >= 2, 10, "the slave trying twice")
                assert (scl.max_offset, s.master_max_offset, fake.status()["slaves"]) == (0, -1, [])
                assert "rmqha:broker/DefaultCluster/other/other-0" in s.last_error, s.last_error

        asyncio.run(run())
    closed = [r.getMessage() for r in caplog.records if "HA link to" in r.getMessage()]
    assert closed and all("other/other-0" in line for line in closed), closed


def test_a_master_certificate_replaced_on_disk_serves_the_next_link(tmp_path, keys: Keys) -> None:
    """As the client port's: the files are re-read for new connections (here the new pair
    names another group, so the next slave refuses it)."""
    own = tmp_path / "own"
    own.mkdir()
    for ext in (".crt", ".key"):
        (own / f"{MASTER.file_stem()}{ext}").write_bytes((keys.good / f"{MASTER.file_stem()}{ext}").read_bytes())
    tls = keys.ha(MASTER, own)
    with replica_stores(tmp_path, SEG, "m", "s", "t") as [(mcl, mem), (s2, em2), (s3, em3)]:
        mem.append(1, 0)
        _append_marked(mcl, 100)

        async def run() -> None:
            m = ha_master(mcl, mem, CFG, known=(2, 3), auth=None, tls=tls)
            async with master_running(m) as port:
                async with slave_running(ha_slave(s2, em2, port, CFG, auth=None, tls=keys.ha(SLAVE))):
                    await wait_until_async(lambda: s2.max_offset == mcl.max_offset, 10, "the first slave replicating")
                for ext in (".crt", ".key"):
                    other = (keys.good / f"{OTHER_GROUP.file_stem()}{ext}").read_bytes()
                    (own / f"{MASTER.file_stem()}{ext}").write_bytes(other)
                assert tls.server.reload_if_changed()
                async with slave_running(ha_slave(s3, em3, port, CFG, broker_id=3, auth=None,
                                                  tls=keys.ha(SLAVE_3))) as late:
                    await wait_until_async(lambda: "other/other-0" in late.last_error, 10, "the new pair refused")
                    assert s3.max_offset == 0

        asyncio.run(run())


# --- configuration -------------------------------------------------------------------------------


def test_the_ha_port_speaks_tls_whenever_the_broker_serves_it(keys: Keys) -> None:
    assert HATls.from_settings(keys.settings(MASTER, mode=TlsMode.DISABLED), CLUSTER, GROUP) is None
    for mode in (TlsMode.PERMISSIVE, TlsMode.ENFORCING):
        tls = HATls.from_settings(keys.settings(MASTER, mode=mode), CLUSTER, GROUP)
        assert tls is not None and tls.server.get().verify_mode.name == "CERT_REQUIRED"
    no_ca = TlsSettings(server_mode=TlsMode.ENFORCING, server_cert_path="x.crt", server_key_path="x.key")
    with pytest.raises(ConfigError, match="tls.server.trustCertPath"):
        HATls.from_settings(no_ca, CLUSTER, GROUP)


def test_a_master_or_slave_refuses_tls_settings_of_another_group(keys: Keys, tmp_path) -> None:
    other = HATls.from_settings(keys.settings(MASTER), CLUSTER, "other")
    assert other is not None
    with replica_stores(tmp_path, SEG, "m") as [(cl, em)]:
        with pytest.raises(ConfigError, match="'other'"):
            ha_master(cl, em, CFG, tls=other)
        with pytest.raises(ConfigError, match="'other'"):
            ha_slave(cl, em, 1, CFG, tls=other)


def test_control_the_same_impostor_with_a_certificate_of_this_group_gets_the_log(tmp_path, keys: Keys) -> None:
    async def run() -> None:
        async with replicating(tmp_path / "pair", keys) as (m, _, mcl):
            with replica_stores(tmp_path, SEG, "impostor") as [(icl, iem)]:
                impostor = ha_slave(icl, iem, int(m.address.rpartition(":")[2]), CFG, auth=None,
                                    tls=keys.ha(SLAVE_3))
                async with slave_running(impostor):
                    await wait_until_async(lambda: icl.max_offset == mcl.max_offset, 10, "the impostor replicating")

    asyncio.run(run())


# --- with the cluster secret: no frame MACs over TLS, the handshake bound to the session ---------


@pytest.mark.parametrize("secret", ["none", "wrong", "right-control"])
def test_over_tls_a_slave_without_the_secret_gets_nothing(tmp_path, caplog, keys: Keys, secret: str) -> None:
    caplog.set_level(logging.INFO, logger="rmqha.ha.master")
    auth = {"none": None, "wrong": auth_for(3, WRONG), "right-control": auth_for(3)}[secret]

    async def run() -> None:
        async with replicating(tmp_path / "pair", keys, secret=True) as (m, real, mcl):
            [link] = m.status()["slaves"]
            assert (link["tls"], link["identity"]) == (True, f"rmqha:broker/{CLUSTER}/{GROUP}/2")
            with replica_stores(tmp_path, SEG, "impostor") as [(icl, iem)]:
                impostor = ha_slave(icl, iem, int(m.address.rpartition(":")[2]), CFG, broker_id=3, auth=auth,
                                    tls=keys.ha(SLAVE_3))
                async with slave_running(impostor):
                    if secret == "right-control":
                        await wait_until_async(lambda: icl.max_offset == mcl.max_offset, 10, "the control replicating")
                        return
                    await wait_until_async(lambda: impostor.sessions >= 2, 10, "the slave refused twice")
                    assert (icl.max_offset, impostor.master_max_offset) == (0, -1)
                    assert [s["broker_id"] for s in m.status()["slaves"]] == [2]
                    # Without the secret the master refuses its plain hello; with a wrong
                    # one the slave already fails the master's proof.
                    why = "authentication failed" if secret == "none" else "proof is wrong"
                    assert why in (refusals()[-1] if secret == "none" else impostor.last_error)

    def refusals() -> list[str]:
        return [r.getMessage() for r in caplog.records if "refusing HA link" in r.getMessage()]

    asyncio.run(run())


@asynccontextmanager
async def stolen_key_relay(port: int, tls: HATls) -> AsyncIterator[tuple[int, bytearray]]:
    """A relay to 127.0.0.1:``port`` holding a broker's certificate and key (``tls``): it
    ends TLS from the slave and starts its own to the master, and forwards the plaintext
    both ways; yields its port and every plaintext byte it forwarded."""
    seen = bytearray()
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def pump(src: Link, dst: Link) -> None:
        try:
            while True:
                data = await src.recv(None)
                seen.extend(data)
                await dst.send([data], 5)
        except (LinkClosed, LinkTimeout, OSError):
            pass
        finally:
            src.close()
            dst.close()

    async def serve(sock: socket.socket) -> None:
        down = await tls.accept(sock, 5)
        up = tls.dial(await connect("127.0.0.1", port, 5))
        await tls.secure(up, 5)
        await asyncio.gather(pump(down, up), pump(up, down))

    async def accept_loop(listener: socket.socket) -> None:
        while True:
            sock, _ = await loop.sock_accept(listener)
            sock.setblocking(False)
            task = asyncio.ensure_future(serve(sock))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        acceptor = asyncio.ensure_future(accept_loop(listener))
        try:
            yield listener.getsockname()[1], seen
        finally:
            for task in (acceptor, *tasks):
                task.cancel()
            await asyncio.gather(acceptor, *tasks, return_exceptions=True)


@pytest.mark.parametrize("bound", [True, False], ids=["bound", "unbound-control"])
def test_a_relay_with_a_stolen_broker_key_cannot_ride_the_secrets_handshake(tmp_path, keys: Keys, monkeypatch,
                                                                            bound: bool) -> None:
    if not bound:
        monkeypatch.setattr(TlsLink, "channel_binding", lambda self: b"")
    with replica_stores(tmp_path, SEG, "m", "s") as [(mcl, mem), (scl, sem)]:
        mem.append(1, 0)
        _append_marked(mcl, 100)

        async def run() -> tuple[bytes, HASlave]:
            m = ha_master(mcl, mem, CFG, sync_state_set=[1, 2], sync_state_set_epoch=1, confirm_offset=0,
                          tls=keys.ha(MASTER))
            async with master_running(m) as port, stolen_key_relay(port, keys.ha(SLAVE_3)) as (relay, seen), \
                    slave_running(ha_slave(scl, sem, relay, CFG, tls=keys.ha(SLAVE))) as s:
                if bound:
                    await wait_until_async(lambda: s.sessions >= 2, 10, "the slave failing twice")
                    assert m.status()["slaves"] == []
                else:
                    assert await m.sync.wait_for_acks(mcl.max_offset, None, timeout=10)
                return bytes(seen), s

        seen, s = asyncio.run(run())
        if bound:
            assert scl.max_offset == 0 and MARK not in seen
            assert "proof is wrong" in s.last_error, s.last_error
        else:
            assert scl.max_offset == mcl.max_offset and MARK in seen

"""Three real controller processes on loopback: registration, elections, fencing, failover.

Brokers are simulated by :class:`FakeBroker`: its own ControllerClient (so closing it
closes the broker's connections, which the leader treats as the broker dying), a
heartbeat loop, and a RemotingServer at its registered address that records
NOTIFY_BROKER_ROLE_CHANGED pushes and who sent them (the controllers send them over an
authenticated channel, as to a real broker holding the secret).  Every group runs with the cluster secret
:data:`SECRET` and every client signs with it (tests/security covers what happens without).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time
import urllib.request

import pytest

from rmqha.cli import admin as admin_cli
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.controller.client import ControllerClient
from rmqha.testing.controllers import ControllerGroup, free_port
from rmqha.errors import ControllerError, RemoteCommandError
from rmqha.net.client import RemotingClient
from rmqha.net.client_security import ClientSecurity
from rmqha.net.connection import Connection
from rmqha.net.server import RemotingServer
from rmqha.protocol.command import RemotingCommand
from rmqha.protocol.request_auth import request_auth
from rmqha.security.channel_auth import key_from_text
from rmqha.security.identity import Identity, Role

TOKEN = "t0ken"
CLUSTER = "c1"
SECRET = "controller-tests-secret"


def client(addresses, **kwargs) -> ControllerClient:
    """A controller client holding the cluster secret (as every broker and tool does)."""
    return ControllerClient(addresses, cluster_secret=SECRET, **kwargs)


class FakeBroker:
    def __init__(self, addresses: list[str], name: str, *, epoch: int = -1, offset: int = -1,
                 priority: int | None = None) -> None:
        self.addresses = addresses
        self.name = name
        self.epoch, self.offset, self.priority = epoch, offset, priority
        self.broker_id: int | None = None
        self.notices: list[RemotingCommand] = []
        #: The channel identity each notice came from (None: a plain connection).
        self.senders: list[Identity | None] = []
        channels = key_from_text(SECRET, Identity.broker(CLUSTER, name, "fake"), (Role.CONTROLLER,))
        self.server = RemotingServer("127.0.0.1", 0, {RequestCode.NOTIFY_BROKER_ROLE_CHANGED: self._notify},
                                     channels=channels)
        self.client: ControllerClient | None = None
        self._beat: asyncio.Task | None = None
        self._serving = False

    async def _notify(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        self.notices.append(cmd)
        self.senders.append(conn.channel_peer)
        return cmd.response()

    @property
    def address(self) -> str:
        return self.server.address

    async def start(self) -> FakeBroker:
        await self.server.start()
        self._serving = True
        self.client = client(self.addresses, request_timeout=2)
        return self

    async def register(self) -> int:
        """GetNextBrokerId -> ApplyBrokerId (retrying on a lost race) -> Register."""
        assert self.client is not None
        code = f"{self.address};{time.time_ns()}"
        for _ in range(50):
            nid = await self.client.get_next_broker_id(CLUSTER, self.name)
            try:
                await self.client.apply_broker_id(CLUSTER, self.name, nid, code)
            except RemoteCommandError as exc:
                assert exc.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID, exc
                continue
            self.broker_id = nid
            await self.client.register_broker(CLUSTER, self.name, nid, self.address)
            return nid
        raise AssertionError("could not get a broker id")

    async def beat_once(self) -> None:
        assert self.client is not None and self.broker_id is not None
        await self.client.heartbeat(CLUSTER, self.name, self.broker_id, self.address,
                                    epoch=self.epoch, max_offset=self.offset, timeout_ms=3000,
                                    priority=self.priority)

    async def start_heartbeats(self) -> None:
        if not self._serving:  # back from the dead, on the same port
            await self.server.start()
            self._serving = True
        await self.beat_once()

        async def loop() -> None:
            while True:
                await asyncio.sleep(0.2)
                await self.beat_once()
        self._beat = asyncio.ensure_future(loop())

    async def die(self) -> None:
        """Stop heartbeating, close every connection to the controllers and the port (as a
        killed process: the controller checks the address of a broker whose connection
        closed, and only a refused connection shows it gone)."""
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        if self.client is not None:
            await self.client.close()
        if self._serving:
            await self.server.stop()
            self._serving = False
        self.client = client(self.addresses, request_timeout=2)

    async def stop(self) -> None:
        await self.die()
        await self.client.close()


async def wait_until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await pred()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    g = ControllerGroup(tmp_path_factory.mktemp("ctl"), 3, settings={"admin_token": TOKEN},
                        per_node={0: {"metrics_port": free_port()}}, cluster_secret=SECRET)
    try:
        g.start()
        yield g
    finally:
        g.stop()


def admin(addresses) -> ControllerClient:
    return client(addresses, request_timeout=2, admin_token=TOKEN)


# --- registration ------------------------------------------------------------------------


def test_registration_races_give_unique_ids(group):
    async def main() -> None:
        brokers = [await FakeBroker(group.addresses, "race").start() for _ in range(8)]
        try:
            ids = await asyncio.gather(*(b.register() for b in brokers))
            assert sorted(ids) == list(range(1, 9))
            async with admin(group.addresses) as c:
                assert await c.get_next_broker_id(CLUSTER, "race") == 9
                # A retry with the same register code is accepted; a stranger is refused
                # and told the next id.
                b = brokers[0]
                code = f"{b.address};again"
                with pytest.raises(RemoteCommandError) as info:
                    await c.apply_broker_id(CLUSTER, "race", b.broker_id, code)
                assert info.value.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
                assert "next id is 9" in info.value.remark
                table = await c.get_sync_state_data(["race", "unknown-set"])
                assert list(table) == ["race"]
                assert {r.broker_id for r in table["race"].not_in_sync_replicas} == set(range(1, 9))
                with pytest.raises(RemoteCommandError) as info:
                    await c.register_broker(CLUSTER, "race", 42, "127.0.0.1:1")
                assert info.value.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
        finally:
            for b in brokers:
                await b.stop()

    asyncio.run(main())


def test_apply_retry_with_same_code_is_idempotent(group):
    async def main() -> None:
        async with admin(group.addresses) as c:
            await c.apply_broker_id(CLUSTER, "idem", 1, "127.0.0.1:9;1")
            await c.apply_broker_id(CLUSTER, "idem", 1, "127.0.0.1:9;1")
            assert await c.get_next_broker_id(CLUSTER, "idem") == 2

    asyncio.run(main())


# --- elections ---------------------------------------------------------------------------


def test_election_rules_one_by_one(group):
    async def main() -> None:
        name = "elect"
        b1, b2, b3 = [await FakeBroker(group.addresses, name).start() for _ in range(3)]
        c = admin(group.addresses)
        try:
            for b in (b1, b2, b3):
                await b.register()
                await b.start_heartbeats()
            assert (b1.broker_id, b2.broker_id, b3.broker_id) == (1, 2, 3)

            # First election: an unregistered requester fails; a registered one wins.
            with pytest.raises(RemoteCommandError) as info:
                await c.elect_master(CLUSTER, name, 9)
            assert info.value.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED
            r = await c.elect_master(CLUSTER, name, 2)
            assert (r.code, r.master_broker_id, r.master_epoch, r.sync_state_set) == (0, 2, 1, [2])
            assert r.broker_addrs == {1: b1.address, 2: b2.address, 3: b3.address}

            # A live master stays.
            r = await c.elect_master(CLUSTER, name, 1)
            assert (r.code, r.master_broker_id) == (ResponseCode.CONTROLLER_MASTER_STILL_EXIST, 2)

            # Master widens the set; then dies: ranking by epoch, then offset.
            await wait_alive(c, name, {1, 2, 3})
            s = await c.alter_sync_state_set(name, 2, 1, [1, 2, 3], 1)
            assert (s.sync_state_set, s.sync_state_set_epoch) == ([1, 2, 3], 2)
            b1.epoch, b1.offset = 1, 100
            b3.epoch, b3.offset = 1, 200
            await b1.beat_once()
            await b3.beat_once()
            await b2.die()

            async def master_is(want: int):
                info = await c.get_replica_info(name)
                return info if info.master_broker_id == want else None

            info = await wait_until(lambda: master_is(3), 10, "b3 elected")
            assert (info.master_epoch, info.sync_state_set, info.sync_state_set_epoch) == (2, [3], 3)
            for b, who in ((b1, "b1"), (b3, "b3")):  # one-way notices, each on its own connection
                await wait_until(lambda b=b: _async_true(any(
                    n.ext_fields.get("masterBrokerId") == "3" for n in b.notices)), 5, f"{who} notified")
            # Over the secret's channel, from a controller (a broker takes no other).
            assert b1.senders and all(p is not None and p.role is Role.CONTROLLER for p in b1.senders)
            note = [n for n in b3.notices if n.ext_fields.get("masterEpoch") == "2"][0]
            assert note.ext_fields["masterAddress"] == b3.address
            assert json.loads(note.body) == {"syncStateSet": [3], "syncStateSetEpoch": 3}

            # Only SyncStateSet members are candidates: b2 comes back with the best offset
            # but is not in {1, 3}; b3 dies; b1 wins.  (A heartbeat may claim at most the
            # group's master epoch, 2 here.)
            await c.alter_sync_state_set(name, 3, 2, [1, 3], 3)
            b2.epoch, b2.offset = 2, 10_000
            await b2.start_heartbeats()
            await b3.die()
            info = await wait_until(lambda: master_is(1), 10, "b1 elected")
            assert (info.master_epoch, info.sync_state_set) == (3, [1])

            # Equal epoch and offset: lower election priority wins.
            b3.epoch, b3.offset, b3.priority = 3, 10_000, 1
            b2.epoch, b2.priority = 3, 7
            await b3.start_heartbeats()
            await b2.beat_once()
            await wait_alive(c, name, {1, 2, 3})
            await c.alter_sync_state_set(name, 1, 3, [1, 2, 3], 5)
            await b1.die()
            info = await wait_until(lambda: master_is(3), 10, "b3 elected by priority")
            assert info.master_epoch == 4

            # An operator may name a live candidate (even with a live master)...
            await wait_alive(c, name, {2, 3})
            await c.alter_sync_state_set(name, 3, 4, [2, 3], 7)
            r = await c.elect_master(CLUSTER, name, 2, designate=True)
            assert (r.code, r.master_broker_id, r.master_epoch) == (0, 2, 5)
            # ...but not a dead one, and not without the admin token.
            with pytest.raises(RemoteCommandError) as info2:
                await c.elect_master(CLUSTER, name, 1, designate=True)
            assert info2.value.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED
            async with client(group.addresses, request_timeout=2) as no_token:
                with pytest.raises(RemoteCommandError) as info2:
                    await no_token.elect_master(CLUSTER, name, 3, designate=True)
                assert info2.value.code == ResponseCode.NO_PERMISSION

            # No candidate: the group is left without a master, epoch + 1, set kept.
            await b3.die()
            await b2.die()

            async def masterless():
                info = await c.get_replica_info(name)
                return info if info.master_broker_id is None else None
            info = await wait_until(masterless, 10, "no master")
            assert (info.master_epoch, info.sync_state_set) == (6, [2])
            # A dead broker whose port still took the leader's probe stays alive until its
            # heartbeat timeout; an unclean election before then could pick it.
            await wait_alive(c, name, set(), gone={2, 3})

            # Unclean elections (runtime switch): any live replica may take over.
            await c.update_controller_config({"enableElectUncleanMaster": "true"})
            b1.epoch = 6
            await b1.start_heartbeats()
            info = await wait_until(lambda: master_is(1), 10, "unclean b1 elected")
            assert (info.master_epoch, info.sync_state_set) == (7, [1])
            await c.update_controller_config({"enableElectUncleanMaster": "false"})
        finally:
            await c.close()
            for b in (b1, b2, b3):
                await b.stop()

    asyncio.run(main())


async def _async_true(value):
    return value


async def wait_alive(c: ControllerClient, name: str, ids: set[int], *,
                     gone: frozenset[int] | set[int] = frozenset()) -> None:
    """Heartbeats are one-way on their own connections: before a request that needs some
    brokers alive (or ``gone`` ones dead), wait until the leader has seen them so, or the
    request races the beat (or the heartbeat timeout)."""
    async def seen() -> bool:
        table = await c.get_sync_state_data([name])
        group_state = table[name]
        replicas = group_state.in_sync_replicas + group_state.not_in_sync_replicas
        alive = {r.broker_id for r in replicas if r.alive}
        return ids <= alive and not (alive & gone)
    await wait_until(seen, 10, f"brokers {sorted(ids)} of {name} seen alive, {sorted(gone)} dead")


def test_alter_sync_state_set_fencing(group):
    async def main() -> None:
        name = "fence"
        b1, b2, b3 = [await FakeBroker(group.addresses, name).start() for _ in range(3)]
        c = admin(group.addresses)
        try:
            for b in (b1, b2):
                await b.register()
                await b.start_heartbeats()
            await b3.register()  # registered, never heartbeats: not alive
            await wait_alive(c, name, {1, 2})
            await c.elect_master(CLUSTER, name, 1)  # master 1, epoch 1, set {1} epoch 1

            async def code_of(master, epoch, ids, set_epoch, broker=name):
                try:
                    await c.alter_sync_state_set(broker, master, epoch, ids, set_epoch)
                except RemoteCommandError as exc:
                    return exc.code
                return 0

            R = ResponseCode
            assert await code_of(1, 1, [1, 2], 1, broker="nope") == R.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
            assert await code_of(1, 1, [1], 1) == R.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED  # equal
            assert await code_of(2, 1, [1, 2], 1) == R.CONTROLLER_INVALID_MASTER
            assert await code_of(1, 0, [1, 2], 1) == R.CONTROLLER_FENCED_MASTER_EPOCH
            assert await code_of(1, 1, [1, 2], 0) == R.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            assert await code_of(1, 1, [1, 7], 1) == R.CONTROLLER_INVALID_REPLICAS
            assert await code_of(1, 1, [1, 3], 1) == R.CONTROLLER_BROKER_NOT_ALIVE
            assert await code_of(1, 1, [2], 1) == R.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED  # no master
            assert await code_of(1, 1, [1, 2], 1) == 0
            # The old set epoch is now stale.
            assert await code_of(1, 1, [1], 1) == R.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            info = await c.get_replica_info(name)
            assert (info.sync_state_set, info.sync_state_set_epoch) == ([1, 2], 2)
        finally:
            await c.close()
            for b in (b1, b2, b3):
                await b.stop()

    asyncio.run(main())


def test_clean_broker_data(group):
    async def main() -> None:
        name = "clean"
        b1, b2 = [await FakeBroker(group.addresses, name).start() for _ in range(2)]
        c = admin(group.addresses)
        try:
            for b in (b1, b2):
                await b.register()
            await b1.start_heartbeats()
            await wait_alive(c, name, {1})
            with pytest.raises(RemoteCommandError, match="still alive") as info:
                await c.clean_broker_data(name, [1], cluster=CLUSTER)
            assert info.value.code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
            with pytest.raises(RemoteCommandError, match="not existed"):
                await c.clean_broker_data("ghost", cluster=CLUSTER)
            await c.clean_broker_data(name, [2], cluster=CLUSTER)
            table = await c.get_sync_state_data([name])
            assert [r.broker_id for r in table[name].not_in_sync_replicas] == [1]
            async with client(group.addresses, request_timeout=2) as no_token:
                with pytest.raises(RemoteCommandError) as info:
                    await no_token.clean_broker_data(name, [1], clean_living_broker=True)
                assert info.value.code == ResponseCode.NO_PERMISSION
            await c.clean_broker_data(name, clean_living_broker=True)
            assert await c.get_sync_state_data([name]) == {}
        finally:
            await c.close()
            for b in (b1, b2):
                await b.stop()

    asyncio.run(main())


# --- protocol robustness, config, metrics, CLI -------------------------------------------


def test_followers_redirect_and_metadata_anywhere(group):
    async def main() -> None:
        leader = group.wait_leader()
        follower = group.addresses[(leader + 1) % 3]
        async with client([follower]) as c:
            resp = await c.request_to(follower, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                                      {"clusterName": CLUSTER, "brokerName": "x"})
            assert resp.code == ResponseCode.CONTROLLER_NOT_LEADER
            assert resp.ext_fields["controllerLeaderAddress"] == group.addresses[leader]
            meta = await c.get_metadata(follower)
            assert meta.leader_address == group.addresses[leader] and not meta.is_leader
            assert [a for _, a in meta.peers] == group.addresses
            # The client follows the redirect by itself.
            assert await c.get_next_broker_id(CLUSTER, "never-seen") == 1

    asyncio.run(main())


def test_unknown_codes_and_malformed_frames(group):
    async def main() -> None:
        addr = group.addresses[0]
        host, port = addr.split(":")
        channel = ClientSecurity().with_channel(key_from_text(SECRET, Identity.admin("test")))
        async with RemotingClient(addr, security=channel) as client:
            resp = await client.request(RemotingCommand.request(4321), 2)
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            signed = request_auth(SECRET).sign(
                RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {"brokerName": "x"}))
            resp = await client.request(signed, 2)
            assert resp.code == ResponseCode.CONTROLLER_INVALID_REQUEST
            for junk in (struct.pack(">i", 1 << 30) + b"zz", struct.pack(">ii", 9, 5) + b"{oops",
                         struct.pack(">ii", 6, 2) + b"[]"):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(junk)
                await writer.drain()
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            resp = await client.request(
                RemotingCommand.request(RequestCode.CONTROLLER_GET_METADATA_INFO), 2)
            assert resp.code == 0 and client.connected

    asyncio.run(main())
    assert "malformed frame" in group.logs()


def test_config_get_update_and_refusals(group):
    async def main() -> None:
        async with admin(group.addresses) as c:
            cfg = await c.get_controller_config(group.addresses[1])
            assert cfg["controllerSelfId"] == "n1" and cfg["adminToken"] == "******"
            await c.update_controller_config({"notifyBrokerRoleChanged": "true"})
            for key in ("controllerStorePath", "controllerPeers", "adminToken"):
                with pytest.raises(RemoteCommandError) as info:
                    await c.update_controller_config({key: "/tmp/elsewhere"})
                assert info.value.code == ResponseCode.NO_PERMISSION
            with pytest.raises(RemoteCommandError, match="unknown configuration key"):
                await c.update_controller_config({"noSuchKey": "1"})
        async with client(group.addresses) as c:
            with pytest.raises(RemoteCommandError) as info:
                await c.update_controller_config({"notifyBrokerRoleChanged": "true"})
            assert info.value.code == ResponseCode.NO_PERMISSION

    asyncio.run(main())


def test_metrics_exported(group):
    asyncio.run(_touch(group))
    port = group.per_node[0]["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'rmqha_controller_requests_total{' in text
    assert 'request_type="CONTROLLER_GET_METADATA_INFO"' in text
    assert "rmqha_controller_raft_role{" in text and "rmqha_controller_raft_term{" in text
    assert "_created" not in text


async def _touch(group):
    async with client([group.addresses[0]]) as c:
        await c.get_metadata(group.addresses[0])


def _admin_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    admin_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_admin_cli(group, capsys):
    a = group.address_list
    assert _admin_cli(["getControllerMetaData", "-a", a]) == 0
    out = capsys.readouterr().out
    assert "#ControllerLeaderAddress\t127.0.0.1:" in out and out.count("#Peer:") == 3
    assert _admin_cli(["get-controller-metadata", "-a", a, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["group"] == "test-group"
    assert _admin_cli(["update-controller-config", "-a", a, "-k", "controllerStorePath",
                       "-v", "/x"]) == 2
    assert "redirects storage" in capsys.readouterr().err
    assert _admin_cli(["get-sync-state-set", "-a", a, "-b", "nothing-here"]) == 1
    assert _admin_cli(["get-controller-config", "-a", group.addresses[0]]) == 0
    assert "controllerGroup" in capsys.readouterr().out


# --- failover and restarts (own groups) ---------------------------------------------------


async def _state_of(addresses, names):
    async with client(addresses, request_timeout=2) as c:
        table = await c.get_sync_state_data(names)
        nxt = {n: await c.get_next_broker_id(CLUSTER, n) for n in names}
        return {n: (s.master_broker_id, s.master_epoch, s.sync_state_set_epoch,
                    [r.broker_id for r in s.in_sync_replicas],
                    [r.broker_address for r in s.in_sync_replicas + s.not_in_sync_replicas])
                for n, s in table.items()}, nxt


def test_leader_kill_and_full_restart_keep_state(tmp_path):
    group = ControllerGroup(tmp_path, 3, cluster_secret=SECRET)
    try:
        group.start()

        async def setup() -> None:
            async with admin(group.addresses) as c:
                for name in ("g1", "g2"):
                    for i in (1, 2, 3):
                        await c.apply_broker_id(CLUSTER, name, i, f"127.0.0.1:{100 + i};x")
                    await c.elect_master(CLUSTER, name, 1)
        asyncio.run(setup())
        before = asyncio.run(_state_of(group.addresses, ["g1", "g2"]))
        assert before[0]["g1"][:2] == (1, 1) and before[1] == {"g1": 4, "g2": 4}

        old = group.wait_leader()
        group.kill(old)
        new = group.wait_leader(timeout=20, exclude={old})
        assert new != old
        assert asyncio.run(_state_of(group.addresses, ["g1", "g2"])) == before

        async def write_more() -> None:
            async with admin(group.addresses) as c:
                await c.apply_broker_id(CLUSTER, "g1", 4, "127.0.0.1:104;x")
        asyncio.run(write_more())
        group.restart(old)
        after_write = asyncio.run(_state_of(group.addresses, ["g1", "g2"]))
        assert after_write[1]["g1"] == 5

        for i in range(3):
            group.kill(i)
        for i in range(3):
            group.restart(i)
        group.wait_leader(timeout=30)
        assert asyncio.run(_state_of(group.addresses, ["g1", "g2"])) == after_write
    finally:
        group.stop()
    assert "truncating already-applied" not in group.logs()


def test_minority_cannot_commit(tmp_path):
    group = ControllerGroup(tmp_path, 3, settings={"commit_timeout": 1500}, cluster_secret=SECRET)
    try:
        group.start()
        leader = group.wait_leader()
        others = [i for i in range(3) if i != leader]
        for i in others:
            group.pause(i)
        try:
            async def attempt() -> list[int]:
                codes = []
                async with client([group.addresses[leader]], request_timeout=3) as c:
                    for n in range(3):
                        resp = await c.request_to(
                            group.addresses[leader], RequestCode.CONTROLLER_APPLY_BROKER_ID,
                            {"clusterName": CLUSTER, "brokerName": f"minority{n}",
                             "appliedBrokerId": 1, "registerCheckCode": "127.0.0.1:1;1"},
                            timeout=3)
                        codes.append(resp.code)
                        await asyncio.sleep(0.3)
                return codes
            codes = asyncio.run(attempt())
            assert ResponseCode.SUCCESS not in codes
            assert set(codes) <= {ResponseCode.SYSTEM_ERROR, ResponseCode.CONTROLLER_NOT_LEADER}
        finally:
            for i in others:
                group.resume(i)
        group.wait_leader(timeout=20)

        async def heal() -> None:
            async with admin(group.addresses) as c:
                await c.apply_broker_id(CLUSTER, "healed", 1, "127.0.0.1:1;1")
                assert await c.get_next_broker_id(CLUSTER, "healed") == 2
        asyncio.run(heal())
    finally:
        group.stop()


def test_refuses_busy_port_and_remote_peers_without_secret(tmp_path):
    from rmqha.cli.controller import main as controller_main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "c.conf"
        cfg.write_text(f"controllerDLegerPeers=n0-127.0.0.1:{port}\ncontrollerDLegerSelfId=n0\n"
                       f"controllerStorePath={tmp_path / 's'}\nallowInsecure=true\n")
        assert controller_main(["--config", str(cfg)]) == 1
    # allow_insecure covers loopback only.
    cfg.write_text(f"controllerDLegerPeers=n0-127.0.0.1:{free_port()};n1-10.9.9.9:9878\n"
                   f"controllerDLegerSelfId=n0\ncontrollerStorePath={tmp_path / 's'}\nallowInsecure=true\n")
    assert controller_main(["--config", str(cfg)]) == 1


def test_group_with_cluster_secret_commits(tmp_path):
    # pysyncobj encrypts its peer traffic with the secret; the group must still elect and commit.
    group = ControllerGroup(tmp_path, 3, settings={"raft_password": "s3cret-for-tests"},
                            cluster_secret=SECRET)
    try:
        group.start()
        group.wait_leader()

        async def main() -> None:
            async with admin(group.addresses) as c:
                await c.apply_broker_id(CLUSTER, "secret", 1, "127.0.0.1:9;1")
                assert await c.get_next_broker_id(CLUSTER, "secret") == 2

        asyncio.run(main())
    finally:
        group.stop()


def test_controller_client_gives_up_without_leader(tmp_path):
    async def main() -> None:
        async with client([f"127.0.0.1:{free_port()}"], request_timeout=0.3) as c:
            with pytest.raises(ControllerError, match="no controller"):
                await c.get_next_broker_id(CLUSTER, "x")

    asyncio.run(main())


def test_new_leader_keeps_a_live_master_and_detects_a_dead_one(tmp_path):
    group = ControllerGroup(tmp_path, 3, cluster_secret=SECRET)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, group.start)
        b1, b2 = [await FakeBroker(group.addresses, "survive").start() for _ in range(2)]
        c = admin(group.addresses)
        try:
            for b in (b1, b2):
                await b.register()
                await b.start_heartbeats()
            await c.elect_master(CLUSTER, "survive", 1)
            await c.alter_sync_state_set("survive", 1, 1, [1, 2], 1)
            old = await loop.run_in_executor(None, group.wait_leader)
            group.kill(old)
            await loop.run_in_executor(None, lambda: group.wait_leader(20, {old}))
            # The new leader hears the brokers (they heartbeat every controller) and must
            # not depose a live master, neither during nor after its heartbeat wait (1 s).
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                info = await c.get_replica_info("survive")
                assert (info.master_broker_id, info.master_epoch) == (1, 1), info
                await asyncio.sleep(0.1)
            await b1.die()

            async def b2_master():
                info = await c.get_replica_info("survive")
                return info if info.master_broker_id == 2 else None
            info = await wait_until(b2_master, 10, "b2 elected by the new leader")
            assert info.master_epoch == 2
        finally:
            await c.close()
            for b in (b1, b2):
                await b.stop()

    try:
        asyncio.run(main())
    finally:
        group.stop()

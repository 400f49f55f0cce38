"""Attacks 2-4 of the outside tester, replayed from a raw client against real processes.

One module-scoped cluster with a cluster secret: a controller, a name server and group
``broker-a`` (master ``a`` id 1, slave ``b`` id 2, in sync; ``b`` polls the controller only
once a minute, so a role change reaches it only through a notice).  The attacker builds
frames with :mod:`rmqha.protocol.command` and sends them over plain sockets
(:mod:`security_wire`).  State-changing requests are taken only over an authenticated
channel (the cluster secret's handshake), so even a valid signature over a plain socket
changes nothing, and a forged answer closes the channel.  Each probe is refused with
NO_PERMISSION (or the identity/epoch check's code) and the admin API shows nothing stored,
changed or elected; each attack has a negative control showing the probe works once it
carries the right proof (or nothing would have stopped it).  Tests that change roles come last.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from cluster import Cluster
from security_wire import WRONG_SECRET, HeartbeatFlood, RawClient, Relay, ask, frame, start_master_and_slave

from rmqha.controller.client import ControllerClient
from rmqha.errors import RemotingError
from rmqha.net.loop import EventLoopThread
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.request_auth import CONTROLLER_SIGNED_CODES
from rmqha.security.channel_auth import key_from_text
from rmqha.security.identity import Identity
from rmqha.testing.local_cluster import port_open

GROUP = "broker-a"
ATTACKER = "10.6.6.6:10911"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("attacks"), cluster_name="sec") as c:
        start_master_and_slave(c, GROUP)
        c.wait_for(lambda: (c.group_route(GROUP) or {}).get("brokerAddrs") == {"0": c.a.address, "2": c.b.address},
                   what="both brokers in the name server's routes")
        yield c


def ctl(live: Cluster) -> str:
    return live.controller_addresses[0]


def ns(live: Cluster) -> str:
    return live.namesrvs[0].address


def controller_view(live: Cluster) -> dict[str, Any]:
    """What the admin API says about the group (and the setting a config write would change)."""
    config = ask(ctl(live), RequestCode.GET_CONTROLLER_CONFIG).body.decode()
    next_id = ask(ctl(live), RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                  {"clusterName": live.cluster_name, "brokerName": GROUP}).ext_fields["nextBrokerId"]
    return {"replica_info": live.replica_info(GROUP), "sync_state": live.sync_state_data(GROUP),
            "next_id": next_id, "unclean": "enableElectUncleanMaster=false" in config}


def refused(resp, *words: str) -> bool:
    return resp.code == ResponseCode.NO_PERMISSION and all(w in (resp.remark or "") for w in words)


# --- attack 4: the controller -----------------------------------------------------------------


def _controller_writes(live: Cluster) -> dict[int, tuple[dict[str, Any], Any]]:
    info = live.replica_info(GROUP)
    cluster = {"clusterName": live.cluster_name, "brokerName": GROUP}
    return {
        RequestCode.CONTROLLER_APPLY_BROKER_ID: (
            {**cluster, "appliedBrokerId": 3, "registerCheckCode": f"{ATTACKER};1"}, b""),
        RequestCode.CONTROLLER_REGISTER_BROKER: ({**cluster, "brokerId": 2, "brokerAddress": ATTACKER}, b""),
        RequestCode.BROKER_HEARTBEAT: (
            {**cluster, "brokerId": 2, "brokerAddr": live.b.address, "epoch": info.master_epoch + 50,
             "maxOffset": 2**40, "heartbeatTimeoutMills": 10**9}, b""),
        RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: (
            {"brokerName": GROUP, "masterBrokerId": 1, "masterEpoch": info.master_epoch},
            {"syncStateSet": [1], "syncStateSetEpoch": info.sync_state_set_epoch}),
        RequestCode.CONTROLLER_ELECT_MASTER: ({**cluster, "brokerId": 2, "designateElect": "true"}, b""),
        RequestCode.CLEAN_BROKER_DATA: ({**cluster, "isCleanLivingBroker": "true"}, b""),
        RequestCode.UPDATE_CONTROLLER_CONFIG: ({}, b"enableElectUncleanMaster=true\n"),
    }


def test_unsigned_controller_writes_are_refused_and_change_nothing(live):
    writes = _controller_writes(live)
    assert set(writes) == set(CONTROLLER_SIGNED_CODES)  # every state-changing code is probed
    before = controller_view(live)
    for code, (ext, body) in writes.items():
        resp = ask(ctl(live), code, ext, body)
        assert refused(resp, "unsigned request"), (code, resp.code, resp.remark)
        resp = ask(ctl(live), code, ext, body, secret=WRONG_SECRET)
        assert refused(resp, "bad signature"), (code, resp.code, resp.remark)
        assert live.cluster_secret not in (resp.remark or "")
    assert controller_view(live) == before
    assert live.controllers[0].alive


def test_fake_broker_id_registers_once_signed(live):
    """Negative control of the write probes: the fake id applied above gets in with proof."""
    ext, body = _controller_writes(live)[RequestCode.CONTROLLER_APPLY_BROKER_ID]
    resp = ask(ctl(live), RequestCode.CONTROLLER_APPLY_BROKER_ID, ext, body, secret=live.cluster_secret,
               channel=live.cluster_secret)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    members = live.sync_state_data(GROUP)["notInSyncReplicas"]
    assert {"brokerId": 3, "brokerAddress": ATTACKER, "alive": False}.items() <= members[0].items()


def test_replayed_tampered_and_stale_requests_are_refused(live):
    group = {"clusterName": live.cluster_name, "brokerName": "replay-g"}
    apply = {**group, "appliedBrokerId": 1, "registerCheckCode": "127.0.0.1:1;1"}
    signed = frame(RequestCode.CONTROLLER_APPLY_BROKER_ID, apply, secret=live.cluster_secret)
    with RawClient(ctl(live), channel=live.cluster_secret) as client:
        assert client.request(signed).code == ResponseCode.SUCCESS  # control: the proof works
        # The same frame again (an APPLY retry with the same code would succeed: idempotent).
        assert refused(client.request(signed), "already used")
        tampered = frame(RequestCode.CONTROLLER_APPLY_BROKER_ID, {**apply, "appliedBrokerId": 2},
                         secret=live.cluster_secret)
        tampered.ext_fields["registerCheckCode"] = f"{ATTACKER};2"
        assert refused(client.request(tampered), "bad signature")
        now = int(time.time() * 1000)
        for skew_ms, when in ((-60_000, "old"), (60_000, "in the future")):
            stale = frame(RequestCode.CONTROLLER_APPLY_BROKER_ID, {**apply, "appliedBrokerId": 2},
                          secret=live.cluster_secret, timestamp_ms=now + skew_ms)
            assert refused(client.request(stale), "stale", when)
    resp = ask(ctl(live), RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, group)
    assert resp.ext_fields["nextBrokerId"] == "2"  # only the first apply counted


def _heartbeat(live: Cluster, **fields: Any) -> dict[str, Any]:
    info = live.replica_info(GROUP)
    return {"clusterName": live.cluster_name, "brokerName": GROUP, "brokerId": 2,
            "brokerAddr": live.b.address, "epoch": info.master_epoch, "maxOffset": -1,
            "heartbeatTimeoutMills": 10**9, **fields}


def test_heartbeats_count_only_as_the_broker_itself_at_a_reached_epoch(live):
    """Even with the secret (an insider, or a copy of a real heartbeat): no other address,
    no epoch the group has not reached, no copy older than what the broker sent last, and
    no timeout beyond the controller's own."""
    before = controller_view(live)
    epoch = before["replica_info"].master_epoch
    secret = live.cluster_secret
    probes = [
        (_heartbeat(live, epoch=epoch + 50, maxOffset=2**40), None, ResponseCode.NO_PERMISSION, "unsigned"),
        (_heartbeat(live, epoch=epoch + 50, maxOffset=2**40), secret, ResponseCode.NO_PERMISSION,
         "above the group's master epoch"),
        (_heartbeat(live, brokerAddr=ATTACKER), secret, ResponseCode.CONTROLLER_BROKER_ID_INVALID,
         f"registered at {live.b.address}"),
        (_heartbeat(live, brokerId=7, brokerAddr=ATTACKER), secret,
         ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, "not registered"),
    ]
    for ext, key, code, words in probes:
        resp = ask(ctl(live), RequestCode.BROKER_HEARTBEAT, ext, secret=key, channel=secret)
        assert resp.code == code and words in (resp.remark or ""), (ext, resp.code, resp.remark)
    # A copy signed before the broker's latest heartbeat (replayed from another controller's link).
    old = int(time.time() * 1000) - 5_000
    with RawClient(ctl(live), channel=live.cluster_secret) as client:
        resp = client.request(frame(RequestCode.BROKER_HEARTBEAT, _heartbeat(live), secret=secret,
                                    timestamp_ms=old))
    assert refused(resp, "not newer"), resp.remark
    assert controller_view(live) == before
    # Negative control: fresh, from its address, at the group's epoch: taken, with the
    # timeout capped at the controller's broker_heartbeat_timeout (3000 in QUICK_CONTROLLER).
    # The real broker heartbeats too: one of its beats signed after ours may land first and
    # make ours "not newer", so a fresh one is asked again until one is taken.
    taken: list[Any] = []

    def fresh_taken() -> bool:
        resp = ask(ctl(live), RequestCode.BROKER_HEARTBEAT, _heartbeat(live), secret=secret, channel=secret)
        assert resp.code == ResponseCode.SUCCESS or refused(resp, "not newer"), resp.remark
        taken.append(resp)
        return resp.code == ResponseCode.SUCCESS

    live.wait_for(fresh_taken, 10, what="a fresh signed heartbeat taken")
    assert taken[-1].ext_fields["heartbeatTimeoutMills"] == "3000"


def test_forged_alter_sync_state_set_is_refused(live):
    """On a group of three registered ids kept alive by signed heartbeats (id 3 holds
    nothing): only the current master at the current epoch may change the set."""
    secret, name = live.cluster_secret, "alter-g"
    group = {"clusterName": live.cluster_name, "brokerName": name}
    addrs = {i: f"127.0.0.1:{i}" for i in (1, 2, 3)}
    with RawClient(ctl(live), channel=live.cluster_secret) as client:
        def send(code: int, ext: dict[str, Any], body: Any = b"", key: str | None = secret):
            return client.request(frame(code, ext, body, secret=key))

        def beat() -> None:
            for i, addr in addrs.items():
                resp = send(RequestCode.BROKER_HEARTBEAT, {**group, "brokerId": i, "brokerAddr": addr, "epoch": 0})
                assert resp.code == ResponseCode.SUCCESS, resp.remark

        for i, addr in addrs.items():
            resp = send(RequestCode.CONTROLLER_APPLY_BROKER_ID,
                        {**group, "appliedBrokerId": i, "registerCheckCode": f"{addr};x"})
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        beat()  # alive before the election: a dead master would be replaced at once
        assert send(RequestCode.CONTROLLER_ELECT_MASTER, {**group, "brokerId": 1}).code == ResponseCode.SUCCESS
        alter = {"brokerName": name, "masterBrokerId": 1, "masterEpoch": 1}
        grow = {"syncStateSet": [1, 3], "syncStateSetEpoch": 1}
        R = ResponseCode
        for ext, body, key, code in (
            (alter, grow, None, R.NO_PERMISSION),
            (alter, grow, WRONG_SECRET, R.NO_PERMISSION),
            ({**alter, "masterBrokerId": 2}, grow, secret, R.CONTROLLER_INVALID_MASTER),
            ({**alter, "masterEpoch": 0}, grow, secret, R.CONTROLLER_FENCED_MASTER_EPOCH),
            (alter, {**grow, "syncStateSet": [1, 9]}, secret, R.CONTROLLER_INVALID_REPLICAS),
        ):
            resp = send(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, ext, body, key)
            assert resp.code == code, (ext, body, resp.code, resp.remark)
        info = live.replica_info(name)
        assert (info.master_id, info.sync_state_set, info.sync_state_set_epoch) == (1, [1], 1)
        # Negative control: the master's own (signed, right epoch) request changes the set.
        beat()
        resp = send(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, alter, grow)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert live.replica_info(name).sync_state_set == [1, 3]


# --- attack 3: the name server ----------------------------------------------------------------


def _register(group: str, addr: str, broker_id: int, epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
    ext = {"brokerName": group, "brokerAddr": addr, "clusterName": "sec", "haServerAddr": addr,
           "brokerId": broker_id, "masterEpoch": epoch}
    body = {"topicConfigSerializeWrapper": {"topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 4,
                                                                      "writeQueueNums": 4, "perm": 6}},
                                            "dataVersion": {"stateVersion": epoch}}}
    return ext, body


def test_route_hijack_by_registering_as_master_is_refused(live):
    before = live.group_route(GROUP)
    ext, body = _register(GROUP, ATTACKER, 0, before["masterEpoch"] + 1)
    assert refused(ask(ns(live), RequestCode.REGISTER_BROKER, ext, body), "unsigned")
    assert refused(ask(ns(live), RequestCode.REGISTER_BROKER, ext, body, secret=WRONG_SECRET), "bad signature")
    after = live.group_route(GROUP)
    assert after == before and after["masterAddr"] == live.a.address
    # Negative control: the same probe with proof takes a group's route over (the signature
    # is what stops it): a victim group registered as its master would be.  (Connections
    # stay open: a registration leaves with the connection it came on.)
    victim = "ns-victim"
    with RawClient(ns(live), channel=live.cluster_secret) as victim_conn, \
            RawClient(ns(live), channel=live.cluster_secret) as attacker_conn:
        ext_v, body_v = _register(victim, "127.0.0.1:1", 0, 1)
        resp = victim_conn.request(frame(RequestCode.REGISTER_BROKER, ext_v, body_v, secret=live.cluster_secret))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert live.group_route(victim)["masterAddr"] == "127.0.0.1:1"
        ext, body = _register(victim, ATTACKER, 0, 2)
        resp = attacker_conn.request(frame(RequestCode.REGISTER_BROKER, ext, body, secret=live.cluster_secret))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert live.group_route(victim)["masterAddr"] == ATTACKER


def test_unregistering_a_live_broker_is_refused(live):
    ext = {"brokerName": GROUP, "brokerAddr": live.b.address, "clusterName": "sec", "brokerId": 2}
    assert refused(ask(ns(live), RequestCode.UNREGISTER_BROKER, ext), "unsigned")
    # Signed, but not over the connection b registered on: only a broker removes itself.
    assert refused(ask(ns(live), RequestCode.UNREGISTER_BROKER, ext, secret=live.cluster_secret,
                       channel=live.cluster_secret),
                   "connection it registered on")
    assert live.group_route(GROUP)["brokerAddrs"] == {"0": live.a.address, "2": live.b.address}
    # Negative control: a broker leaving over its own connection is removed.
    reg, body = _register("ns-leaver", "127.0.0.1:2", 0, 1)
    leave = {"brokerName": "ns-leaver", "brokerAddr": "127.0.0.1:2", "clusterName": "sec", "brokerId": 0}
    with RawClient(ns(live), channel=live.cluster_secret) as broker:
        assert broker.request(frame(RequestCode.REGISTER_BROKER, reg, body, secret=live.cluster_secret)).code == 0
        assert live.group_route("ns-leaver")["brokerAddrs"] == {"0": "127.0.0.1:2"}
        resp = broker.request(frame(RequestCode.UNREGISTER_BROKER, leave, secret=live.cluster_secret))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert not live.group_route("ns-leaver")["brokerAddrs"]


# --- channels: writes only over an authenticated channel, answers MACed -----------------------


def test_signed_writes_over_a_plain_connection_change_nothing(live):
    """A holder of a valid signature (say, a copy of a real request) who skips the channel
    handshake: refused, nothing changed; reads stay open to plain clients."""
    before, route = controller_view(live), live.group_route(GROUP)
    for code, (ext, body) in _controller_writes(live).items():
        resp = ask(ctl(live), code, ext, body, secret=live.cluster_secret)
        assert refused(resp, "plain connection"), (code, resp.code, resp.remark)
    ext, body = _register(GROUP, ATTACKER, 0, route["masterEpoch"] + 1)
    assert refused(ask(ns(live), RequestCode.REGISTER_BROKER, ext, body, secret=live.cluster_secret),
                   "plain connection")
    assert controller_view(live) == before and live.group_route(GROUP) == route
    resp = ask(ns(live), RequestCode.GET_BROKER_MEMBER_GROUP, {"brokerName": GROUP})
    assert resp.code == ResponseCode.SUCCESS and resp.json_body()["masterAddr"] == live.a.address


def test_a_channel_acts_only_for_its_own_broker_group(live):
    """An insider's channel named as a broker of another group may not heartbeat for this
    one; one named as a name server is closed at its handshake (no broker registers so)."""
    stranger = Identity.broker(live.cluster_name, "other-group", "x")
    ext = _heartbeat(live)
    with RawClient(ctl(live), channel=live.cluster_secret, identity=stranger) as client:
        resp = client.request(frame(RequestCode.BROKER_HEARTBEAT, ext, secret=live.cluster_secret))
    assert refused(resp, "may not act for broker group"), resp.remark
    reg, body = _register("ns-stranger", "127.0.0.1:3", 0, 1)
    with RawClient(ns(live), channel=live.cluster_secret, identity=Identity.namesrv("x")) as client:
        with pytest.raises(ConnectionError):
            client.request(frame(RequestCode.REGISTER_BROKER, reg, body, secret=live.cluster_secret))
    assert not live.group_route("ns-stranger")["brokerAddrs"]


def test_forged_controller_answer_never_reaches_the_broker(live):
    """A man in the middle rewrites the master's address in the controller's answers: a
    broker's channel closes on it; on a plain connection (the negative control) the
    forged master is what the caller gets."""
    fake = "127.0.0.6" + live.a.address[len("127.0.0.1"):]
    assert live.a.address.startswith("127.0.0.1:")

    def forge(chunk: bytes) -> bytes:
        return chunk.replace(live.a.address.encode(), fake.encode())

    async def main() -> None:
        key = key_from_text(live.cluster_secret, Identity.broker(live.cluster_name, GROUP, "b"))
        async with Relay(ctl(live), rewrite=forge) as mitm:
            plain = ControllerClient([mitm.address], request_timeout=2.0)
            channel = ControllerClient([mitm.address], request_timeout=2.0, channel=key)
            try:
                resp = await plain.request_to(mitm.address, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                              {"brokerName": GROUP})
                assert resp.ext_fields["masterAddress"] == fake  # the attack lands
                with pytest.raises(RemotingError, match="authentication failed"):
                    await channel.request_to(mitm.address, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                             {"brokerName": GROUP})
                assert mitm.rewritten == 2
                # Without the relay, the same client gets the real answer.
                resp = await channel.request_to(ctl(live), RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                                {"brokerName": GROUP})
                assert resp.ext_fields["masterAddress"] == live.a.address
            finally:
                await plain.close()
                await channel.close()

    asyncio.run(main())


def test_a_broker_behind_a_forging_relay_takes_nothing_until_the_forging_stops(live):
    """A real broker whose controller link runs through a man in the middle that turns every
    answer's code into another: its channels close, it takes no id and no role (and does
    not serve).  Negative control: once the relay only relays, the same process comes up
    as master."""
    loop = EventLoopThread("mitm-relay")
    relay = Relay(ctl(live), rewrite=lambda chunk: chunk.replace(b'"code":0', b'"code":1'))
    loop.run(relay.__aenter__())
    c = None
    try:
        c = live.start_broker("mitm-g", wait=False, controller_addr=relay.address)
        live.wait_for(lambda: c.log_contains("authentication failed"), 20,
                      what="the broker's channel to close on a forged answer", process=c)
        live.holds(lambda: c.broker_id() is None and not port_open(c.address), 1.0,
                   what="no id settled, nothing served")
        assert relay.rewritten > 0
        relay.rewrite = lambda chunk: chunk  # the relay stops forging
        live.wait_role(c, "master", 30)
    finally:
        if c is not None:
            c.stop()
        loop.run(relay.__aexit__())
        loop.stop()


# --- attack 2: forged role notices (these change roles: they come last) -----------------------


def _notice(broker_id: int, address: str, epoch: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return ({"masterAddress": address, "masterEpoch": epoch, "syncStateSetEpoch": 99,
             "masterBrokerId": broker_id}, {"syncStateSet": [broker_id], "syncStateSetEpoch": 99})


def notice_as_controller(live: Cluster, address: str, ext: dict[str, Any], body: Any):
    """A signed role notice over a channel dialled as a controller (how the leader sends them)."""
    return ask(address, RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body, secret=live.cluster_secret,
               channel=live.cluster_secret, identity=Identity.controller("insider"))


def _set_notify(live: Cluster, on: bool) -> None:
    body = f"notifyBrokerRoleChanged={'true' if on else 'false'}\n"
    resp = ask(ctl(live), RequestCode.UPDATE_CONTROLLER_CONFIG, {}, body, secret=live.cluster_secret,
               channel=live.cluster_secret)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_forged_role_notice_does_not_make_a_slave_master(live):
    a, b = live.a, live.b
    epoch = live.replica_info(GROUP).master_epoch
    ext, body = _notice(2, b.address, epoch + 1)
    assert refused(ask(b.address, RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body), "unsigned")
    assert refused(ask(b.address, RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body, secret=WRONG_SECRET),
                   "bad signature")
    # Signed, but copied onto a plain connection: refused before the handler.
    assert refused(ask(b.address, RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext, body, secret=live.cluster_secret),
                   "plain connection")
    assert live.broker_status(b)["unconfirmedNoticesIgnored"] == 0
    # Signed, over a channel as a controller (an insider): taken to the controller, which
    # does not confirm it.
    resp = notice_as_controller(live, b.address, ext, body)
    assert resp.code == ResponseCode.SUCCESS
    status = live.broker_status(b)
    assert (status["role"], status["masterEpoch"], status["masterAddress"]) == ("slave", epoch, a.address)
    assert status["unconfirmedNoticesIgnored"] == 1
    assert live.replica_info(GROUP).master_epoch == epoch

    # Negative control: once the controller's record names b (a designated election with
    # the controller's own notices off, and b polling once a minute), the same signed
    # notice is what makes b master.
    _set_notify(live, False)
    try:
        resp = ask(live.controller_addresses[0], RequestCode.CONTROLLER_ELECT_MASTER,
                   {"clusterName": live.cluster_name, "brokerName": GROUP, "brokerId": 2,
                    "designateElect": "true"}, secret=live.cluster_secret, channel=live.cluster_secret)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert live.replica_info(GROUP).master_id == 2
        live.holds(lambda: live.broker_role(b) == "slave", 0.5, what="b waiting for a notice")
        resp = notice_as_controller(live, b.address, ext, body)
        assert resp.code == ResponseCode.SUCCESS
        live.wait_role(b, "master", 10)
        assert live.broker_status(b)["masterEpoch"] == epoch + 1
    finally:
        _set_notify(live, True)
    live.wait_for(lambda: live.replica_info(GROUP).sync_state_set == [1, 2], 30,
                  what="a back in the SyncStateSet under master b")


def _make_b_master(live: Cluster) -> None:
    """b (id 2) master with a in its SyncStateSet, whatever the tests before left (so a test
    that needs it passes alone as well as after test_forged_role_notice_does_not_make_a_slave_master)."""
    if live.replica_info(GROUP).master_id != 2:
        resp = ask(ctl(live), RequestCode.CONTROLLER_ELECT_MASTER,
                   {"clusterName": live.cluster_name, "brokerName": GROUP, "brokerId": 2,
                    "designateElect": "true"}, secret=live.cluster_secret, channel=live.cluster_secret)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        live.wait_role(live.b, "master", 10)
    live.wait_for(lambda: live.replica_info(GROUP).sync_state_set == [1, 2], 30,
                  what="a in the SyncStateSet under master b")


def test_heartbeats_cannot_keep_a_stopped_master_alive(live):
    """Attack 4b: heartbeats sent for a master that stopped (SIGSTOP: its connections stay
    open, so only its heartbeat timeout can reveal it) keep it "alive" only with proof,
    and only for the timeout the controller allows."""
    a, b = live.a, live.b
    _make_b_master(live)
    flood = HeartbeatFlood(ctl(live), _heartbeat(live, maxOffset=2**40)).start()
    b.pause()
    try:
        live.wait_for(lambda: live.replica_info(GROUP).master_id == 1, 20, what="a elected despite the flood")
    finally:
        flood.stop()
    assert flood.answers and flood.codes() == {ResponseCode.NO_PERMISSION}
    b.kill()

    # Negative control: the same flood with proof, for the new master a (asking a timeout
    # of 11 days), keeps it "alive" past the 3 s timeout; once it stops, a is judged dead
    # within the controller's own timeout (no candidate left: the group has no master).
    epoch = live.replica_info(GROUP).master_epoch
    signed = HeartbeatFlood(ctl(live), _heartbeat(live, brokerId=1, brokerAddr=a.address, epoch=epoch),
                            secret=live.cluster_secret, channel=live.cluster_secret)
    a.pause()
    try:
        signed.start()
        signed.wait_answers(1)
        assert signed.answers[0][0] == ResponseCode.SUCCESS
        assert signed.answers[0][1]["heartbeatTimeoutMills"] == "3000"
        live.holds(lambda: (i := live.replica_info(GROUP)).master_id == 1 and i.master_epoch == epoch, 4.0,
                   what="the signed flood keeping the stopped master alive")
        signed.stop()
        live.wait_for(lambda: live.replica_info(GROUP).master_epoch == epoch + 1, 10,
                      what="the master judged dead once the flood stops")
        assert live.replica_info(GROUP).master_id is None
    finally:
        signed.stop()
        a.resume()

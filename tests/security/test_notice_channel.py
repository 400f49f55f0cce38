"""Role notices reach a broker only over a controller's authenticated channel, on real processes.

One module-scoped cluster with a cluster secret: a controller, a name server and group
``broker-a`` (master ``a`` id 1, slave ``b`` id 2, in sync; ``b`` polls the controller only
once a minute, so a role change reaches it only through a notice).  The controller leader
sends NOTIFY_BROKER_ROLE_CHANGED over an authenticated channel it dials to the broker's
client port (the cluster secret's handshake, then a MAC on every frame); the broker takes
a notice no other way, so neither a forged notice nor a validly signed one copied onto a
plain connection changes anything, and a channel opened with another secret never gets
past its handshake.  Each refusal has a negative control (the same notice from a
controller's channel reaches the handler, which still confirms it with the controller
leader), and a real failover still moves the slave by its notice.  Tests that change roles
come last.
"""
from __future__ import annotations

import hashlib
import hmac
import socket
import struct
from typing import Any

import pytest
from cluster import Cluster
from security_wire import WRONG_SECRET, RawClient, ask, frame, start_master_and_slave

from rmqha.errors import AuthenticationError
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.protocol.command import RemotingCommand, decode_frame, encode
from rmqha.security.channel_auth import ChannelEndpoint, key_from_text, message
from rmqha.security.identity import Identity

GROUP = "broker-a"
NOTIFY = RequestCode.NOTIFY_BROKER_ROLE_CHANGED
CONTROLLER = Identity.controller("insider")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("notices"), cluster_name="sec") as c:
        start_master_and_slave(c, GROUP)
        yield c


def _notice(live: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """A notice naming the slave b master at the next epoch (what an attacker wants)."""
    epoch = live.replica_info(GROUP).master_epoch
    return ({"masterAddress": live.b.address, "masterEpoch": epoch + 1, "syncStateSetEpoch": 99,
             "masterBrokerId": 2}, {"syncStateSet": [2], "syncStateSetEpoch": 99})


def _b_view(live: Cluster) -> tuple[Any, ...]:
    s = live.broker_status(live.b)
    return s["role"], s["masterEpoch"], s["masterAddress"], s["unconfirmedNoticesIgnored"]


def refused(resp: RemotingCommand, *words: str) -> bool:
    return resp.code == ResponseCode.NO_PERMISSION and all(w in (resp.remark or "") for w in words)


def test_a_forged_notice_on_a_plain_connection_is_refused(live):
    ext, body = _notice(live)
    before = _b_view(live)
    assert refused(ask(live.b.address, NOTIFY, ext, body), "unsigned")
    assert refused(ask(live.b.address, NOTIFY, ext, body, secret=WRONG_SECRET), "bad signature")
    assert _b_view(live) == before
    assert before[:3] == ("slave", live.replica_info(GROUP).master_epoch, live.a.address)


def test_a_validly_signed_notice_off_a_controllers_channel_is_refused(live):
    ext, body = _notice(live)
    before = _b_view(live)
    # The controller's own signature, copied onto a plain connection.
    resp = ask(live.b.address, NOTIFY, ext, body, secret=live.cluster_secret)
    assert refused(resp, "plain connection", "authenticated channel"), resp.remark
    # A channel with the secret, but as someone other than a controller: the broker closes
    # it at the handshake, before any frame is read.
    for who in (Identity.admin("insider"), Identity.broker(live.cluster_name, GROUP, "b-insider")):
        with pytest.raises(OSError):
            ask(live.b.address, NOTIFY, ext, body, secret=live.cluster_secret,
                channel=live.cluster_secret, identity=who)
    assert live.b.log_contains("only controller may connect here")
    assert _b_view(live) == before  # nothing reached the handler

    # Negative control: over a channel dialled as a controller the same notice reaches the
    # handler, which asks the controller leader; its record does not confirm it.
    resp = ask(live.b.address, NOTIFY, ext, body, secret=live.cluster_secret,
               channel=live.cluster_secret, identity=CONTROLLER)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    role, epoch, master, unconfirmed = _b_view(live)
    assert (role, epoch, master, unconfirmed) == (*before[:3], before[3] + 1)


def _read_message(sock: socket.socket) -> bytes:
    """One handshake message as it travels (``u16 length || body``), read whole."""
    data = b""
    while len(data) < 2 or len(data) < 2 + struct.unpack(">H", data[:2])[0]:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        data += chunk
    return data


def _press_on(address: str, secret: str, cmd: RemotingCommand) -> RemotingCommand | None:
    """An impostor's channel: it opens as a controller and, whatever the broker's proof
    says, answers with a proof made with ``secret`` and sends ``cmd`` tagged with it.  The
    broker's answer, or None when the broker closed the connection without one."""
    endpoint = ChannelEndpoint(key_from_text(secret, CONTROLLER), dialler=True, max_frame_bytes=1 << 20)
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(endpoint.start())
        server_auth = _read_message(sock)
        data = encode(cmd)
        try:
            proof, _ = endpoint.feed(server_auth)
            sealed = endpoint.seal(data)
        except AuthenticationError:  # the broker proved another secret: press on anyway
            forged = hmac.new(secret.encode(), server_auth, hashlib.sha256).digest()
            proof = message(b"\x03" + struct.pack(">H", len(forged)) + forged)  # CLIENT_AUTH
            sealed = data + forged[:16]
        sock.sendall(proof + sealed)
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            _, frames = endpoint.feed(chunk)
            if frames:
                return decode_frame(memoryview(frames[0])[4:])


def test_a_channel_with_the_wrong_secret_never_gets_through_its_handshake(live):
    ext, body = _notice(live)
    before = _b_view(live)
    # An honest dialler with the wrong secret stops at the broker's proof.
    with pytest.raises(AuthenticationError, match="server's proof is wrong"):
        RawClient(live.b.address, channel=WRONG_SECRET, identity=CONTROLLER)
    # One that presses on (a proof and a tag of its own secret, the notice signed with the
    # right one, as if copied) is closed at its proof: the notice is never read.
    signed = frame(NOTIFY, ext, body, secret=live.cluster_secret)
    assert _press_on(live.b.address, WRONG_SECRET, signed) is None
    live.wait_for(lambda: live.b.log_contains("CLIENT_AUTH: the client's proof is wrong"), 5,
                  what="the broker logging the refused proof")
    assert _b_view(live) == before

    # Negative control: the same impostor code holding the secret gets its notice handled.
    signed = frame(NOTIFY, ext, body, secret=live.cluster_secret)
    resp = _press_on(live.b.address, live.cluster_secret, signed)
    assert resp is not None and resp.code == ResponseCode.SUCCESS, resp
    assert _b_view(live)[3] == before[3] + 1


def test_a_real_failover_still_moves_the_slave_by_its_notice(live):
    """b polls once a minute: it becomes master in seconds only because the leader's notice,
    sent over its channel, got through (and was confirmed with the leader)."""
    epoch = live.replica_info(GROUP).master_epoch
    live.a.kill()
    live.wait_role(live.b, "master", 20)
    status = live.broker_status(live.b)
    assert status["masterEpoch"] == epoch + 1
    assert live.b.log_contains("notification (confirmed): master of broker-a is now 2")
    controller = live.controllers[0]
    assert not controller.log_contains(f"role-change notice to {live.b.address} failed")

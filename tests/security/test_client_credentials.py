"""rmqha's own clients with RocketMQ ACL 1.0 credentials against a broker with ``aclEnable``.

A name server and a broker guarded by ``plain_acl.yml`` run in the test's loop (the
messaging tests' :class:`Env`).  ``Producer`` / ``Consumer`` / ``BlockingProducer`` /
``TopicAdmin`` sign every request when given ``access_key`` / ``secret_key`` (or
``RMQHA_ACCESS_KEY`` / ``RMQHA_SECRET_KEY``); the same calls with a wrong secret or without
credentials are refused and store nothing, which shows the broker really checks what the
right secret passes.  ``rmqha send`` takes ``--access-key`` / ``--secret-key`` and the
environment.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_messaging import Env, consume, run

from rmqha._core import load
from rmqha.client import BlockingProducer, Message, Producer, SendStatus
from rmqha.client.admin import TopicAdmin
from rmqha.client.model import MessageQueue
from rmqha.client.route import ClientSession
from rmqha.client.send_request import RequestBuilder
from rmqha.client.sender import Sender
from rmqha.errors import ClientError, ConfigError, RemotingError
from rmqha.net.client_security import ClientSecurity, Credentials
from rmqha.protocol.command import SERIALIZE_ROCKETMQ, VERSION, decode_frame, encode
from rmqha.protocol.message import CompressionType
from rmqha.security.replay import NONCE_FIELD, TIME_FIELD
from rmqha.security.signature import sign, signature_matches, signed_content, signed_fields

TOPIC = "TopicAcl"
ACL = """\
accounts:
  - accessKey: app-access
    secretKey: app-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [TopicAcl=PUB|SUB]
    groupPerms: [g-acl=SUB]
  - accessKey: admin-access
    secretKey: admin-secret-1
    admin: true
"""
APP = {"access_key": "app-access", "secret_key": "app-secret-1"}
WRONG = {"access_key": "app-access", "secret_key": "not-the-secret"}
ADMIN = {"access_key": "admin-access", "secret_key": "admin-secret-1"}
FAST_FAIL = {"retry_deadline_s": 2.0, "max_attempts": 2, "send_timeout_s": 2.0}


@pytest.fixture
def acl(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return path


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RMQHA_ACCESS_KEY", raising=False)
    monkeypatch.delenv("RMQHA_SECRET_KEY", raising=False)


async def _create_topic(env: Env, **creds: str) -> str:
    try:
        async with TopicAdmin(env.namesrv, timeout_s=3, **creds) as admin:
            changes = await admin.create_topic(TOPIC, 2, 2)
    except (ClientError, RemotingError) as exc:
        return f"failed: {exc}"
    return "ok" if changes and all(c.ok for c in changes) else f"failed: {changes}"


async def _send(env: Env, body: bytes, **creds: str) -> str:
    try:
        async with Producer(env.namesrv, **creds, **FAST_FAIL) as p:
            return (await p.send(TOPIC, Message(body))).status.value
    except (ClientError, RemotingError) as exc:
        return f"failed: {exc}"


def test_signed_clients_work_and_wrong_secrets_are_refused(tmp_path: Path, acl: Path) -> None:
    async def main() -> dict[str, Any]:
        async with Env(tmp_path) as env:
            b = await env.broker(acl_file=acl)
            out: dict[str, Any] = {"create as app": await _create_topic(env, **APP),
                                   "create as admin": await _create_topic(env, **ADMIN)}
            before = b.log.max_offset
            out["wrong"] = await _send(env, b"wrong", **WRONG)
            out["none"] = await _send(env, b"none")
            out["stored after refusals"] = b.log.max_offset - before
            out["right"] = await _send(env, b"right", **APP)
            out["stored after right"] = b.log.max_offset - before
            out["consumed wrong"] = await _consume(env, **WRONG)
            out["consumed right"] = await _consume(env, **APP)
            return out

    out = run(main())
    assert out["create as admin"] == "ok"
    assert out["create as app"].startswith("failed") and "admin" in out["create as app"].lower()
    assert out["wrong"].startswith("failed") and "signature" in out["wrong"].lower(), out["wrong"]
    assert out["none"].startswith("failed") and "AccessKey" in out["none"], out["none"]
    assert out["stored after refusals"] == 0
    assert out["right"] == SendStatus.SEND_OK.value and out["stored after right"] > 0
    assert out["consumed wrong"] == [] and out["consumed right"] == [b"right"]


async def _consume(env: Env, **creds: str) -> list[bytes]:
    try:
        got = await consume(env.namesrv, "g-acl", TOPIC, 1, timeout=4.0, **creds)
    except (ClientError, RemotingError):
        return []
    return [m.body for m in got]


def test_credentials_from_the_environment(tmp_path: Path, acl: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> list[str]:
        async with Env(tmp_path) as env:
            await env.broker(acl_file=acl)
            assert await _create_topic(env, **ADMIN) == "ok"
            monkeypatch.setenv("RMQHA_ACCESS_KEY", "app-access")
            monkeypatch.setenv("RMQHA_SECRET_KEY", "not-the-secret")
            wrong = await _send(env, b"env wrong")
            monkeypatch.setenv("RMQHA_SECRET_KEY", "app-secret-1")
            return [wrong, await _send(env, b"env right")]

    wrong, right = run(main())
    assert wrong.startswith("failed") and right == SendStatus.SEND_OK.value


def _spy_on_in_place_signing(monkeypatch: pytest.MonkeyPatch) -> list[bytes | None]:
    """What every ``Credentials.sign_send_frame`` call returns, in order (None: it could
    not sign in place)."""
    in_place: list[bytes | None] = []
    plain_sign = Credentials.sign_send_frame

    def counted(self: Credentials, *args: Any) -> bytes | None:
        in_place.append(plain_sign(self, *args))
        return in_place[-1]

    monkeypatch.setattr(Credentials, "sign_send_frame", counted)
    return in_place


def test_blocking_producer_signs_on_its_blocking_links(tmp_path: Path, acl: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first send the route is cached and sends go over a blocking socket, a
    path of its own: it signs too (three sends, one blocking link), the frame the send
    codec made, in place, as the first send's attempt on the producer's loop does."""
    in_place = _spy_on_in_place_signing(monkeypatch)
    async def main() -> tuple[list[str], int, str, int, int]:
        async with Env(tmp_path) as env:
            b = await env.broker(acl_file=acl)
            assert await _create_topic(env, **ADMIN) == "ok"

            def send(creds: dict[str, str], n: int) -> tuple[list[str], int]:
                with BlockingProducer(env.namesrv, **creds, **FAST_FAIL) as p:
                    statuses = []
                    for i in range(n):
                        try:
                            statuses.append(p.send(TOPIC, Message(b"b%d" % i)).status.value)
                        except ClientError as exc:
                            statuses.append(f"failed: {exc}")
                    # The thread's own blocking links: the send path this test is about.
                    mine = getattr(p._loop._local, "mine", None)
                    return statuses, len(mine.links) if mine else 0

            loop = asyncio.get_running_loop()
            statuses, links = await loop.run_in_executor(None, send, APP, 3)
            signed_by_app = len(in_place)
            admitted = b.acl_lane_admitted
            wrong, _ = await loop.run_in_executor(None, send, WRONG, 1)
            assert b.acl_lane_admitted == admitted  # a wrong signature: the full check refused it
            return statuses, links, wrong[0], admitted, signed_by_app

    statuses, links, wrong, admitted, signed_by_app = run(main())
    assert statuses == [SendStatus.SEND_OK.value] * 3 and links == 1
    assert wrong.startswith("failed")
    # Each send signed in place (the first on the producer's loop, which also learns the
    # route, the other two on the blocking link) and checked on the broker's plain-send
    # lane; the wrong secret's attempts were signed in place too, and refused.
    assert admitted == 3 and signed_by_app == 3 and len(in_place) > 3 and all(in_place)


def test_producer_sends_and_batches_go_as_frames_signed_in_place(
        tmp_path: Path, acl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The asyncio Producer's attempts, one message or a batch, are the send codec's frame
    signed in place and sent as bytes (no command is built for them); with a wrong secret
    the same frames are refused and nothing is stored."""
    in_place = _spy_on_in_place_signing(monkeypatch)
    monkeypatch.setattr(Sender, "command", None)  # any attempt as a command would fail

    async def main() -> tuple[list[str], int, int, str, int]:
        async with Env(tmp_path) as env:
            b = await env.broker(acl_file=acl)
            assert await _create_topic(env, **ADMIN) == "ok"
            before = b.log.max_offset
            async with Producer(env.namesrv, **APP, **FAST_FAIL) as p:
                one = await p.send(TOPIC, Message(b"one"))
                batch = await p.send_batch(TOPIC, [b"b1", b"b2", b"b3"])
            statuses = [r.status.value for r in [one, *batch]]
            stored, signed = b.log.max_offset - before, len(in_place)
            wrong = await _send(env, b"wrong", **WRONG)
            return statuses, stored, signed, wrong, b.log.max_offset - before

    statuses, stored, signed, wrong, stored_after_wrong = run(main())
    assert statuses == [SendStatus.SEND_OK.value] * 4 and stored > 0
    assert signed == 2 and all(in_place)  # one frame for the message, one for the batch
    assert wrong.startswith("failed") and "signature" in wrong.lower(), wrong
    assert stored_after_wrong == stored and len(in_place) > signed


def test_only_the_credentials_own_hook_signs_frames_in_place() -> None:
    """Another hook (it may add anything to the command) keeps attempts as commands; no
    hook sends unsigned frames; the credentials' own hook signs frames in place."""
    creds = Credentials(**APP)

    def frame_of(security: ClientSecurity | None) -> bytes | None:
        session = ClientSession("127.0.0.1:9", security=security)
        sender = Sender(session, RequestBuilder("pg", compress_over_bytes=1 << 20,
                                                compression=CompressionType.LZ4,
                                                max_batch_bytes=1 << 20, compress_batches=False),
                        send_timeout_s=1, max_attempts=1, backoff_s=0, max_backoff_s=0,
                        retry_deadline_s=1)
        req = sender.requests.single(TOPIC, Message(b"x"), None)
        return sender.frame(req, MessageQueue(TOPIC, "b", 1), 5)

    own = frame_of(ClientSecurity.from_options(**APP))
    assert own is not None and b'"AccessKey":"app-access"' in own
    assert frame_of(None) is not None and b"AccessKey" not in frame_of(None)  # type: ignore[operator]
    assert frame_of(ClientSecurity(None, lambda cmd: None, credentials=creds)) is None
    assert frame_of(ClientSecurity(None, creds.sign)) is None  # no credentials to sign with


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_send_frame_is_signed_in_place_as_sign_signs_its_command(batch: bool) -> None:
    """The blocking link signs the send codec's frame without building a command: the
    broker reads the fields, signature and signed bytes :func:`sign` gives the command."""
    frame = load("send_codec").encode_send(
        320 if batch else 310, 77, VERSION, "pg", TOPIC, 0, 1700000000123, 3,
        "UNIQ_KEY\x01AB12\x02WAIT\x01true\x02", batch, 2, b"\x00body\xff")
    cmd = decode_frame(frame[4:])
    stamp = {TIME_FIELD: "1800000000000", NONCE_FIELD: "0011223344556677"}
    creds = Credentials(**APP, stamper=lambda: dict(stamp))
    signed = creds.sign_send_frame(frame, cmd.ext_fields, cmd.body)
    assert signed is not None
    got = decode_frame(signed[4:])
    want = sign(cmd.ext_fields, cmd.body, APP["access_key"], APP["secret_key"], extra=stamp)
    assert (got.code, got.opaque, got.body, got.ext_fields) == (cmd.code, 77, cmd.body, want)
    assert signature_matches(got.ext_fields, got.body, APP["secret_key"], got.version)
    # The broker's lane parses the same signing material from it.
    lane = load("send_frames").parse_send(signed[4:], (), True)
    assert lane is not None and lane[12:] == (
        APP["access_key"], want["Signature"].encode(),
        signed_fields(got.ext_fields, got.version))
    assert lane[14] + lane[10] == signed_content(got.ext_fields, got.body, got.version)
    # Negative controls: another secret's signature does not verify; what cannot be signed
    # in place (a security token, a key JSON would escape, a binary header) is left alone.
    assert not signature_matches(got.ext_fields, got.body, WRONG["secret_key"], got.version)
    assert Credentials("app\"access", "app-secret-1").sign_send_frame(
        frame, cmd.ext_fields, cmd.body) is None
    assert Credentials(**APP, security_token="tok").sign_send_frame(
        frame, cmd.ext_fields, cmd.body) is None
    cmd.serialize_type = SERIALIZE_ROCKETMQ
    assert creds.sign_send_frame(encode(cmd), cmd.ext_fields, cmd.body) is None


def _cli_send(namesrv: str, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RMQHA_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "rmqha", "send", "-n", namesrv, "-t", TOPIC,
                           "--timeout", "2", "--retry-deadline-s", "2", *flags, "from the cli"],
                          capture_output=True, text=True, timeout=60, check=False, env=full_env)


def test_cli_send_with_credentials(tmp_path: Path, acl: Path) -> None:
    async def main() -> dict[str, subprocess.CompletedProcess[str]]:
        async with Env(tmp_path) as env:
            await env.broker(acl_file=acl)
            assert await _create_topic(env, **ADMIN) == "ok"
            loop = asyncio.get_running_loop()
            ns = env.namesrv

            async def cli(*flags: str, env: dict[str, str] | None = None) -> Any:
                return await loop.run_in_executor(None, lambda: _cli_send(ns, *flags, env=env))
            return {
                "flags": await cli("--access-key", "app-access", "--secret-key", "app-secret-1"),
                "wrong": await cli("--access-key", "app-access", "--secret-key", "not-the-secret"),
                "none": await cli(),
                "env": await cli(env={"RMQHA_ACCESS_KEY": "app-access",
                                      "RMQHA_SECRET_KEY": "app-secret-1"}),
                "half": await cli("--access-key", "app-access"),
            }

    r = run(main())
    for case in ("flags", "env"):
        assert r[case].returncode == 0 and "SEND_OK" in r[case].stdout, (case, r[case].stderr[-2000:])
    for case in ("wrong", "none"):
        assert r[case].returncode != 0 and "SEND_OK" not in r[case].stdout, case
    assert r["half"].returncode != 0 and "an access key was given without the secret key" in r["half"].stderr


def test_credentials_are_whole_and_keep_the_secret_out_of_repr() -> None:
    creds = Credentials.resolve("ak-1234567", "sk-1234567", env={})
    assert creds is not None and "sk-1234567" not in repr(creds)
    assert Credentials.resolve(env={}) is None
    with pytest.raises(ConfigError, match="a secret key was given without the access key"):
        Credentials.resolve(secret_key="sk-1234567", env={})
    env = {"RMQHA_ACCESS_KEY": "ak-env-123", "RMQHA_SECRET_KEY": "sk-env-123"}
    assert Credentials.resolve(env=env) == Credentials("ak-env-123", "sk-env-123")


def test_cli_group_changes_sign_with_an_admin_account(tmp_path: Path, acl: Path) -> None:
    """``rmqha update-sub-group`` takes ``--access-key`` / ``--secret-key``: an admin
    account changes a group on a broker with ``aclEnable``; an application's account and
    no account are refused (the negative control: the broker does check)."""
    async def main() -> dict[str, subprocess.CompletedProcess[str]]:
        async with Env(tmp_path) as env:
            b = await env.broker(acl_file=acl)
            loop = asyncio.get_running_loop()

            async def cli(*flags: str) -> Any:
                clean = {k: v for k, v in os.environ.items() if not k.startswith("RMQHA_")}
                return await loop.run_in_executor(None, lambda: subprocess.run(
                    [sys.executable, "-m", "rmqha", "update-sub-group", "-b", b.address, "-g", "g-acl",
                     "--timeout", "5", *flags], capture_output=True, text=True, timeout=60, env=clean))
            return {"admin": await cli("--access-key", ADMIN["access_key"], "--secret-key", ADMIN["secret_key"]),
                    "app": await cli("--access-key", APP["access_key"], "--secret-key", APP["secret_key"]),
                    "none": await cli()}

    r = run(main())
    assert r["admin"].returncode == 0 and "OK" in r["admin"].stdout, r["admin"].stdout + r["admin"].stderr[-2000:]
    for case in ("app", "none"):
        assert r[case].returncode != 0 and "FAILED" in r[case].stdout, (case, r[case].stdout)

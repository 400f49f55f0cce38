"""The ACL validator against requests signed by the official client (PyPI ``rocketmq``
0.4.4, C++ 1.2 inside, ``Producer.set_session_credentials``).

A tiny asyncio remoting server plays name server and broker on one port: it answers the
route request with a route to itself and checks each send with :class:`AclValidator`,
answering SYSTEM_ERROR with the refusal as remark like RocketMQ's broker.  The client runs
in a child process (this file is its driver), so a crash in the C++ library cannot take
pytest down.
"""
from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rmqha.errors import AclAuthenticationError, AclError, AclPermissionError
from rmqha.protocol.codes import RequestCode
from rmqha.security.acl import AclValidator

ROUTE_CODE = 105
ACL = """\
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret-1
    defaultTopicPerm: DENY
    topicPerms: [TopicAcl=PUB]
"""


def _driver(namesrv: str, access_key: str, secret_key: str, topic: str) -> int:
    from rocketmq.client import Message, Producer  # type: ignore[import-untyped]

    producer = Producer("PG_ACL", timeout=2000)
    producer.set_namesrv_addr(namesrv)
    producer.set_session_credentials(access_key, secret_key, "ALIYUN")
    producer.start()
    msg = Message(topic)
    msg.set_keys("k1")
    msg.set_body(b"signed body")
    try:
        result = producer.send_sync(msg)
        print(json.dumps({"status": int(result.status)}), flush=True)
    except Exception as exc:  # noqa: BLE001 - the binding raises its own exception types
        print(json.dumps({"error": str(exc)}), flush=True)
        # The C++ 1.2 client may abort in shutdown() after a send that failed every retry
        # (boost::thread_interrupted); the answer is printed, so leave without it.
        os._exit(0)
    producer.shutdown()
    return 0


@dataclass
class Request:
    code: int
    version: int
    ext_fields: dict[str, str]
    body: bytes
    remote_ip: str


def _java_str(value: Any) -> str:
    # The C++ client sends some ext fields as JSON numbers; Java reads them as strings.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack(">ii", 4 + len(raw) + len(body), len(raw)) + raw + body


class AclServer:
    """Name server and broker on one 127.0.0.1 port, checking sends with ``validator``."""

    def __init__(self, validator: AclValidator) -> None:
        self.validator = validator
        self.requests: list[Request] = []
        self.refusals: list[AclError] = []
        self.port = 0

    @staticmethod
    async def _read(reader: asyncio.StreamReader, ip: str) -> tuple[Request, int]:
        """One frame: int32 total length, int32 serialize type << 24 | header length,
        JSON header, body."""
        (total,) = struct.unpack(">i", await reader.readexactly(4))
        data = await reader.readexactly(total)
        header_length = struct.unpack(">i", data[:4])[0] & 0xFFFFFF
        header = json.loads(data[4:4 + header_length])
        fields = {k: _java_str(v) for k, v in (header.get("extFields") or {}).items()}
        req = Request(header["code"], header["version"], fields, data[4 + header_length:], ip)
        return req, header["opaque"]

    def _answer(self, req: Request, opaque: int) -> bytes:
        reply: dict[str, Any] = {"code": 0, "flag": 1, "opaque": opaque, "language": "JAVA",
                                 "version": 441, "remark": "", "extFields": {}}
        if req.code == ROUTE_CODE:
            route = {"orderTopicConf": "", "filterServerTable": {},
                     "queueDatas": [{"brokerName": "b0", "readQueueNums": 1, "writeQueueNums": 1,
                                     "perm": 6, "topicSysFlag": 0}],
                     "brokerDatas": [{"cluster": "c", "brokerName": "b0",
                                      "brokerAddrs": {"0": f"127.0.0.1:{self.port}"}}]}
            return _frame(reply, json.dumps(route).encode())
        try:
            self.validator.check(req.code, req.ext_fields, req.body, req.remote_ip, req.version)
        except AclError as exc:
            self.refusals.append(exc)
            reply.update(code=exc.response_code, remark=exc.remark)
            return _frame(reply)
        if req.code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
            reply["extFields"] = {"msgId": "7F00000100002A9F0000000000000000", "queueId": "0",
                                  "queueOffset": "0"}
        return _frame(reply)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ip = writer.get_extra_info("peername")[0]
        try:
            while True:
                req, opaque = await self._read(reader, ip)
                self.requests.append(req)
                writer.write(self._answer(req, opaque))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def run_client(self, home: Path, access_key: str, secret_key: str, topic: str) -> dict[str, Any]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        env = {**os.environ, "HOME": str(home)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, f"127.0.0.1:{self.port}", access_key, secret_key, topic,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            server.close()
            await server.wait_closed()
        lines = [line for line in out.decode().splitlines() if line.startswith("{")]
        assert lines, f"the driver printed no result; stderr: {err.decode()[-2000:]}"
        return json.loads(lines[-1])


def _sends(server: AclServer) -> list[Request]:
    return [r for r in server.requests if r.code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2)]


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return path


def test_official_client_signed_send_is_accepted(acl_file: Path, tmp_path: Path) -> None:
    server = AclServer(AclValidator(acl_file))
    result = asyncio.run(server.run_client(tmp_path, "producer-ak", "producer-secret-1", "TopicAcl"))
    assert result == {"status": 0}, server.refusals
    send = _sends(server)[0]
    assert send.ext_fields["AccessKey"] == "producer-ak" and send.body == b"signed body"
    assert not server.refusals
    # The captured, signed route request passes too (no resource, signature only) ...
    route = next(r for r in server.requests if r.code == ROUTE_CODE)
    server.validator.check(route.code, route.ext_fields, route.body, route.remote_ip, route.version)
    # ... and the captured send does not survive any change to what was signed.
    with pytest.raises(AclAuthenticationError, match="check signature failed"):
        server.validator.check(send.code, send.ext_fields, send.body + b"!", send.remote_ip, send.version)
    other_topic = {**send.ext_fields, "topic": "Other"}
    with pytest.raises(AclAuthenticationError, match="check signature failed"):
        server.validator.check(send.code, other_topic, send.body, send.remote_ip, send.version)


def test_official_client_wrong_secret_is_refused(acl_file: Path, tmp_path: Path) -> None:
    server = AclServer(AclValidator(acl_file))
    result = asyncio.run(server.run_client(tmp_path, "producer-ak", "not-the-secret", "TopicAcl"))
    assert "error" in result
    assert server.refusals and all(isinstance(e, AclAuthenticationError) for e in server.refusals)
    assert "check signature failed for accessKey=producer-ak" in str(server.refusals[0])
    assert all("not-the-secret" not in str(e) for e in server.refusals)
    assert server.refusals[0].response_code == 1  # SYSTEM_ERROR, as RocketMQ's broker answers


def test_official_client_without_topic_permission_is_refused(acl_file: Path, tmp_path: Path) -> None:
    server = AclServer(AclValidator(acl_file))
    result = asyncio.run(server.run_client(tmp_path, "producer-ak", "producer-secret-1", "TopicDenied"))
    assert "error" in result
    assert server.refusals and isinstance(server.refusals[0], AclPermissionError)
    assert "no PUB default permission for topic:TopicDenied" in str(server.refusals[0])


if __name__ == "__main__":
    sys.exit(_driver(*sys.argv[1:5]))

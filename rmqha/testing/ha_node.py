"""A harness, not a product part: a standalone HA replica process without controller or broker
(``python -m rmqha.testing.ha_node``).

It opens a commitlog and epoch map in ``--dir`` and runs either an :class:`HAMaster`
(``--role master``, optionally appending a new epoch first) or an :class:`HASlave`
(``--role slave --master host:port``).  Tests and benchmarks use it to put the two sides
of a link in different processes (to kill one mid-transfer, or to measure loopback
throughput without sharing a core's GIL).

Protocol on stdio, one JSON object per line:

* stdout: ``{"event": "ready", "port": P}`` once serving, then a status object after every
  command and every ``--status-ms`` (0 = only on request);
* the cluster secret, when ``RMQHA_CLUSTER_SECRET`` (or ``RMQHA_CLUSTER_SECRET_FILE``) is
  set: every HA link then authenticates, this node being broker ``--broker-id`` of
  ``--cluster`` / ``--group``;
* stdin commands: ``write COUNT BODY_BYTES`` (append COUNT messages in one batch),
  ``produce RATE SECONDS BODY_BYTES`` (master: a steady load of single appends, each body
  starting with its ``time.monotonic_ns()`` as int64 so a reader can measure lag),
  ``status``, ``quit``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import struct
import sys
import time
from typing import Any

from rmqha.net import loop as event_loop
from rmqha.ha.auth import HAAuth
from rmqha.ha.config import HAConfig
from rmqha.ha.master import HAMaster
from rmqha.ha.slave import HASlave
from rmqha.security.identity import Identity
from rmqha.security.secret import load_cluster_secret
from rmqha.store import CommitLog, EpochMap

EPOCH_FILE = "epochFileCheckpoint"


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rmqha.testing.ha_node", description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="store directory (commitlog/ and the epoch file)")
    p.add_argument("--role", choices=("master", "slave"), required=True)
    p.add_argument("--cluster", default="DefaultCluster")
    p.add_argument("--group", default="g")
    p.add_argument("--broker-id", type=int, required=True)
    p.add_argument("--segment-bytes", type=int, default=64 << 20)
    p.add_argument("--port", type=int, default=0, help="master: HA port (0 = any free port)")
    p.add_argument("--epoch", type=int, default=None, help="master: append this epoch at the max offset")
    p.add_argument("--sync-state-set", type=_ids, default=[], help="master: initial set, e.g. 1,2")
    p.add_argument("--known", type=_ids, default=None, help="master: replica ids it accepts (default any)")
    p.add_argument("--master", default="", help="slave: the master's HA address host:port")
    p.add_argument("--protocol", default=None, choices=("framed", "rocketmq"))
    p.add_argument("--learner", action="store_true", help="slave: async learner")
    p.add_argument("--batch-bytes", type=int, default=None)
    p.add_argument("--window-bytes", type=int, default=None)
    p.add_argument("--heartbeat-ms", type=int, default=None)
    p.add_argument("--housekeeping-ms", type=int, default=None)
    p.add_argument("--status-ms", type=int, default=0)
    p.add_argument("--flush", default="async", choices=("async", "sync"))
    return p


def _config(args: argparse.Namespace) -> HAConfig:
    over: dict[str, Any] = {}
    if args.batch_bytes is not None:
        over["ha_transfer_batch_bytes"] = args.batch_bytes
    if args.window_bytes is not None:
        over["ha_send_window_bytes"] = args.window_bytes
    if args.heartbeat_ms is not None:
        over["ha_send_heartbeat_interval_ms"] = args.heartbeat_ms
    if args.housekeeping_ms is not None:
        over["ha_housekeeping_interval_ms"] = args.housekeeping_ms
    if args.protocol is not None:
        over["ha_protocol"] = args.protocol
    return HAConfig(**over)


def _auth(args: argparse.Namespace) -> HAAuth | None:
    """HA link authentication from the environment's cluster secret (None without one)."""
    secret = load_cluster_secret()
    if secret is None:
        return None
    return HAAuth(secret, Identity.broker(args.cluster, args.group, str(args.broker_id)))


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _produce(cl: CommitLog, rate: float, seconds: float, body_bytes: int) -> None:
    """Append ``rate`` single messages per second for ``seconds``, paced every millisecond."""
    pad = bytes(max(body_bytes - 8, 0))
    total = int(rate * seconds)
    sent = 0
    t0 = time.monotonic()
    while sent < total:
        due = min(int((time.monotonic() - t0) * rate) + 1, total)
        while sent < due:
            cl.append("lag", struct.pack(">q", time.monotonic_ns()) + pad)
            sent += 1
        await asyncio.sleep(0.001)


async def run(args: argparse.Namespace) -> int:
    cfg = _config(args)
    auth = _auth(args)
    cl = CommitLog(os.path.join(args.dir, "commitlog"), segment_bytes=args.segment_bytes, flush=args.flush)
    em = EpochMap.open(os.path.join(args.dir, EPOCH_FILE))
    node: HAMaster | HASlave
    try:
        if args.role == "master":
            cl.cut_to_last_whole_record()
            if args.epoch is not None and args.epoch > em.last_epoch():
                em.append(args.epoch, cl.max_offset)
            known = set(args.known) if args.known is not None else None
            node = HAMaster(
                cl, em, group=args.group, broker_id=args.broker_id, config=cfg,
                is_known_replica=(lambda i: True) if known is None else known.__contains__,
                sync_state_set=args.sync_state_set or [args.broker_id],
                confirm_offset=cl.max_offset, auth=auth,
            )
            port = await node.start("127.0.0.1", args.port)
        else:
            node = HASlave(cl, em, group=args.group, broker_id=args.broker_id,
                           master_ha_address=args.master, config=cfg, async_learner=args.learner, auth=auth)
            await node.start()
            port = 0
        _emit({"event": "ready", "port": port, "max_offset": cl.max_offset, "pid": os.getpid()})
        reader = await _stdin_lines()
        status_s = args.status_ms / 1000 if args.status_ms > 0 else None
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), status_s)
            except asyncio.TimeoutError:
                _emit(node.status())
                continue
            if not line:
                break
            cmd = line.decode().split()
            if not cmd:
                continue
            if cmd[0] == "quit":
                break
            if cmd[0] == "produce":
                await _produce(cl, float(cmd[1]), float(cmd[2]), int(cmd[3]))
            if cmd[0] == "write":
                count, size = int(cmd[1]), int(cmd[2])
                body = os.urandom(size)
                cl.append_batch("ha-node", [body] * count)
            _emit(node.status())
        await node.stop()
        return 0
    finally:
        cl.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    return event_loop.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())

"""``rmqha demo`` (:mod:`rmqha.demo.cluster`) and ``rmqha demo-store`` (:mod:`rmqha.demo.store`).

``demo-store`` is the storage demo: it appends ``--messages`` 1 KiB messages (default one
million) to a commitlog in a temporary directory (or ``--dir``) in batches, with a progress
bar on stderr, closes it, reopens it (recovery scans and validates the tail), reads every
record back and checks its body, topic, queue and queue offset, and prints records/s and
MB/s for each twin.  The exit code is non-zero when any record fails verification.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from rmqha import _core
from rmqha.demo import cluster as cluster_demo
from rmqha.demo.grpc_load import client_missing
from rmqha.demo.options import DemoOptions
from rmqha.demo.run import run_demo
from rmqha.demo.store import run_twin


def _rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def cmd_demo_store(args: argparse.Namespace) -> int:
    if args.messages <= 0 or args.size < 0 or args.batch <= 0:
        print("rmqha demo-store: --messages and --batch must be > 0, --size >= 0", file=sys.stderr)
        return 2
    twins = ["python"] if _core.NO_EXTENSIONS else ["cython", "python"]
    root = args.dir or tempfile.mkdtemp(prefix="rmqha-demo-")
    results = []
    try:
        for twin in twins:
            directory = os.path.join(root, f"commitlog-{twin}")
            if os.path.exists(directory):
                shutil.rmtree(directory)
            results.append(run_twin(twin, directory, args.messages, args.size, args.batch,
                                    args.segment_mb << 20))
            if not args.keep:
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'twin':<8} {'messages':>10} {'append rec/s':>14} {'append MB/s':>12} "
          f"{'fsync s':>8} {'reopen s':>9} {'verify rec/s':>13} {'errors':>7}")
    for r in results:
        print(f"{r.implementation:<8} {r.messages:>10} "
              f"{_rate(r.messages, r.append_seconds):>14,.0f} "
              f"{_rate(r.bytes_written / 1e6, r.append_seconds):>12,.1f} "
              f"{r.flush_seconds:>8.2f} {r.reopen_seconds:>9.2f} "
              f"{_rate(r.messages, r.verify_seconds):>13,.0f} {r.errors:>7}")
    print("append = append_batch into warm mmap-ed segments (page cache); fsync = the final "
          "flush to disk; reopen = recovery (scan + validate)")
    if args.keep:
        print(f"stores kept in {root}")
    failed = sum(r.errors for r in results)
    if failed:
        print(f"verification FAILED: {failed} bad record(s)", file=sys.stderr)
        return 1
    print("verification passed: every record read back intact")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.grpc and (missing := client_missing()) is not None:
        print(missing, file=sys.stderr)
        return 2
    if args.messages is None:
        args.messages = _GRPC_MESSAGES if args.grpc else _MESSAGES
    if args.in_flight is None:
        args.in_flight = _GRPC_IN_FLIGHT if args.grpc else _IN_FLIGHT
    if args.messages < 2 or args.size < _MIN_CLUSTER_BODY or args.batch <= 0 or args.in_flight <= 0:
        print(f"rmqha demo: --messages must be >= 2, --size >= {_MIN_CLUSTER_BODY}, "
              "--batch and --in-flight > 0", file=sys.stderr)
        return 2
    if not 0.0 < args.kill_at < 1.0:
        print("rmqha demo: --kill-at must be between 0 and 1", file=sys.stderr)
        return 2
    if args.dir and os.path.isdir(args.dir) and os.listdir(args.dir):
        # Old stores would bring old broker identities into a new cluster.
        print(f"rmqha demo: --dir {args.dir} is not empty (an earlier run?); give a new or "
              "empty directory", file=sys.stderr)
        return 2
    return run_demo(DemoOptions(
        messages=args.messages, body_bytes=args.size, batch=args.batch, in_flight=args.in_flight,
        kill_at=args.kill_at, directory=Path(args.dir) if args.dir else None, keep=args.keep,
        json=args.json, stall=args.stall, grpc=args.grpc, plaintext=args.plaintext))


#: Bodies start with a 10-digit sequence number.
_MIN_CLUSTER_BODY = 10
#: The defaults of --messages and --in-flight: the 5.x client sends one message per
#: request (no batches), so the gRPC demo sends fewer with more in flight.
_MESSAGES, _GRPC_MESSAGES = 100_000, 10_000
_IN_FLIGHT, _GRPC_IN_FLIGHT = 4, 64


def register(subparsers: argparse._SubParsersAction) -> None:
    doc = cluster_demo.__doc__ or ""
    p = subparsers.add_parser(
        "demo", help="run a 3-controller, 3-broker cluster here, kill its master under load, "
                     "check nothing acknowledged is lost",
        description=doc.split("\n\n")[1] if doc else None)
    p.add_argument("--messages", type=int, default=None,
                   help=f"messages to produce (default {_MESSAGES}; {_GRPC_MESSAGES} with --grpc)")
    p.add_argument("--size", type=int, default=256, help="body bytes per message (default 256)")
    p.add_argument("--batch", type=int, default=32,
                   help="messages per send (default 32; --grpc sends one per request)")
    p.add_argument("--in-flight", type=int, default=None,
                   help=f"sends in flight at once (default {_IN_FLIGHT}; {_GRPC_IN_FLIGHT} with --grpc)")
    p.add_argument("--grpc", action="store_true",
                   help="send and receive through an `rmqha proxy` with RocketMQ 5's official Python "
                        "client (rocketmq-python-client: run `make demo-grpc`, which has it)")
    p.add_argument("--kill-at", type=float, default=0.4,
                   help="kill the master once this fraction is acknowledged (default 0.4)")
    p.add_argument("--no-stall", dest="stall", action="store_false",
                   help="kill the master without first stalling its links to the slaves (the "
                        "old master then usually has nothing to cut when it rejoins)")
    p.add_argument("--plaintext", action="store_true",
                   help="run the cluster with its cluster secret only, for comparison: no TLS, no "
                        "ACL (by default every remoting port and HA link is mutual TLS, as deploy/ "
                        "runs it, brokers check ACL and the clients sign as the demo's account)")
    p.add_argument("--dir", default=None,
                   help="directory for configs, stores and logs (default: a temp dir, removed "
                        "afterwards unless the demo fails)")
    p.add_argument("--keep", action="store_true", help="keep the temp directory afterwards")
    p.add_argument("--json", action="store_true",
                   help="print only one JSON summary on stdout (for scripts)")
    p.set_defaults(func=cmd_demo)

    p = subparsers.add_parser(
        "demo-store", help="storage only: append N 1 KiB messages, reopen, verify, print rates "
                           "(both twins)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--messages", type=int, default=1_000_000, help="messages per twin")
    p.add_argument("--size", type=int, default=1024, help="body bytes per message")
    p.add_argument("--batch", type=int, default=1000, help="messages per append_batch call")
    p.add_argument("--segment-mb", type=int, default=1024, help="segment size in MiB")
    p.add_argument("--dir", default=None, help="directory for the stores (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    p.set_defaults(func=cmd_demo_store)

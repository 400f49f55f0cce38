"""``rmqha demo``'s entry point: the scenario over remoting (:class:`rmqha.demo.cluster.Demo`)
or, with ``--grpc``, through ``rmqha proxy`` (:class:`rmqha.demo.grpc_load.GrpcDemo`);
then the summary or its JSON, and the exit code (0 ok, 1 failed, 130 interrupted).
"""
from __future__ import annotations

import json
import sys

from rmqha.demo.cluster import Demo
from rmqha.demo.options import DemoOptions
from rmqha.demo.report import format_summary, verdict


def run_demo(opts: DemoOptions) -> int:
    """Run the demo; the process exit code (0 ok, 1 failed, 130 interrupted)."""
    if opts.grpc:
        from rmqha.demo.grpc_load import GrpcDemo  # needs the proxy extra's client only then

        s = GrpcDemo(opts).run()
    else:
        s = Demo(opts).run()
    if opts.json:
        print(json.dumps(s.to_json(), indent=None, sort_keys=True), flush=True)
    else:
        if not s.interrupted:
            print(format_summary(s))
        else:
            left = len(s.leftover_processes)
            print(f"stopped {s.processes_started - left} of {s.processes_started} processes; "
                  f"ports still open: {', '.join(map(str, s.leftover_ports)) or 'none'}")
        print(verdict(s))
        if s.kept:
            print(f"configs, stores and logs kept in {s.directory}")
        sys.stdout.flush()
    if s.interrupted:
        return 130
    return 0 if s.ok else 1

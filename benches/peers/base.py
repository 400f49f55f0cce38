"""What every system in the peer comparison offers, and the workloads run against each.

A :class:`PeerSystem` starts a real group of three servers on loopback (free ports), keeps
a one-copy and a three-copy destination, and answers each workload with its own client in
the way that client is meant to be used.  :func:`run_workload` measures wall time and this
process's CPU time around a workload, so "client CPU per message" is the client's own
cost (the servers are other processes).
"""
from __future__ import annotations

import statistics
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from rmqha.testing.local_cluster import PORT_CLASH_RETRIES, free_port, pid_listens, port_open, taken_port

__all__ = ["free_port"]  # the harness's choice: below the ephemeral range, never twice

MESSAGE_BYTES = 1024


class PortTaken(Exception):
    """A server exited at start because another process took a port chosen for it."""


def wait_port(port: int, timeout: float = 60.0, what: str = "server",
              server: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Wait until ``port`` accepts connections; with ``server``, until that process itself
    listens there (another may hold a port it was given), and PortTaken at once if it
    exits saying in ``log`` that a port was taken."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            text = log.read_text(errors="replace") if log is not None else ""
            if (taken := taken_port(text)) is not None:
                raise PortTaken(f"{what}: port {taken} taken by another process")
            raise RuntimeError(f"{what} exited with {server.returncode} before opening port {port}")
        if _serving(port, server):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not open port {port} within {timeout:g}s")


def _serving(port: int, server: subprocess.Popen[bytes] | None) -> bool:
    """Whether ``server`` itself listens on ``port`` (without one, or where /proc cannot
    tell: whether anything accepts connections there)."""
    if not port_open(f"127.0.0.1:{port}", 0.5):
        return False
    return server is None or pid_listens(server.pid, port) is not False


def wait_until(condition, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as exc:  # a server still starting answers errors
            last = exc
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout:g}s (last: {last!r})")


class NotOffered(Exception):
    """The system's client has no such operation (the table names why)."""


@dataclass
class Measurement:
    system: str
    workload: str
    copies: int
    messages: int
    elapsed_s: float
    client_cpu_s: float
    latencies_s: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def msg_per_s(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000 if self.latencies_s else float("nan")

    @property
    def p99_ms(self) -> float:
        if not self.latencies_s:
            return float("nan")
        s = sorted(self.latencies_s)
        return s[min(len(s) - 1, int(0.99 * len(s)))] * 1000

    @property
    def cpu_us_per_msg(self) -> float:
        return self.client_cpu_s / self.messages * 1e6 if self.messages else float("nan")


class PeerSystem(ABC):
    """A replicated log or queue server group and its Python client."""

    name: str = "?"
    #: One line each, shown beside the table.
    ack_semantics: str = ""
    fsync_semantics: str = ""

    @abstractmethod
    def start(self, workdir: Path) -> None: ...

    def start_on_free_ports(self, workdir: Path) -> None:
        """:meth:`start`, and when a server exits because another process took a port
        chosen for it, :meth:`stop` and start again on fresh ports (in a fresh directory),
        up to PORT_CLASH_RETRIES starts."""
        for attempt in range(1, PORT_CLASH_RETRIES + 1):
            try:
                return self.start(workdir if attempt == 1 else workdir.with_name(f"{workdir.name}-{attempt}"))
            except PortTaken:
                self.stop()
                if attempt == PORT_CLASH_RETRIES:
                    raise

    @abstractmethod
    def stop(self) -> None:
        """Stop every process this system started (idempotent)."""

    @abstractmethod
    def one_at_a_time(self, copies: int, n: int, body: bytes) -> list[float]:
        """Send ``n`` messages, each acked before the next; per-message latencies."""

    @abstractmethod
    def batches(self, copies: int, n_batches: int, size: int, body: bytes) -> list[float]:
        """Send ``n_batches`` batches (or pipelines) of ``size``, one in flight; latencies."""

    @abstractmethod
    def window(self, copies: int, n: int, window: int, body: bytes) -> None:
        """Send ``n`` single messages with up to ``window`` unacknowledged at a time."""

    @abstractmethod
    def read_back(self, copies: int, n: int) -> int:
        """Read at least ``n`` stored messages from the start; how many were read."""

    def failover(self, body: bytes) -> float | None:
        """Kill (SIGKILL) the leader under one-at-a-time sends; seconds from the kill to the
        next acked send, or None when the system has no automatic failover."""
        return None


def run_workload(system: PeerSystem, workload: str, copies: int, messages: int,
                 fn) -> Measurement:  # type: ignore[no-untyped-def]
    cpu0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    latencies = out if isinstance(out, list) else []
    return Measurement(system.name, workload, copies, messages, elapsed, cpu, latencies)

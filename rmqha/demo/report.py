"""What ``rmqha demo`` tells: the progress bar and console lines while it runs, and its
results (:class:`DemoSummary`: the election, the rejoin, sent, acknowledged, consumed,
duplicated, lost) as a table, a JSON object and a verdict (``FAILED`` when any
acknowledged message is missing or no failover was seen).
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn


@dataclass
class ElectionEvent:
    """One change of the controller's view of the group, seconds after the kill."""

    after_s: float
    master_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set: list[int]


@dataclass
class Failover:
    killed: str = ""
    killed_pid: int = 0
    acked_at_kill: int = 0
    old_master_id: int | None = None
    old_master_address: str | None = None
    old_epoch: int = 0
    old_sync_state_set: list[int] = field(default_factory=list)
    new_master_id: int | None = None
    new_master_address: str | None = None
    new_epoch: int = 0
    new_sync_state_set: list[int] = field(default_factory=list)
    #: The links to the slaves stalled before the kill (see DemoOptions.stall).
    stalled: bool = False
    stall_s: float | None = None
    #: The master's max offset just after the links stalled: no slave can have more.
    master_max_at_stall: int | None = None
    #: As seen at the end of the stall, just before the kill: the master's max offset, its
    #: slaves' acks and the slaves' own max offsets.
    master_max_at_kill: int | None = None
    slave_acks_at_kill: list[int] = field(default_factory=list)
    slave_max_at_kill: list[int] = field(default_factory=list)
    #: Where the last whole block that crossed each slave's link before the stall ends, in
    #: the order of slave_max_at_kill (None: the relay could not follow that stream).
    crossed_at_stall: list[int | None] = field(default_factory=list)
    #: master_max_at_kill - max(slave_max_at_kill): on no slave, never acknowledged.
    tail_bytes: int | None = None
    #: Bytes the stalled links held when the master died, dropped with it.
    link_bytes_dropped: int = 0
    #: SIGKILL -> the controller names another master.
    election_s: float | None = None
    #: SIGKILL -> the first send acknowledged by the new master.
    first_ack_s: float | None = None
    events: list[ElectionEvent] = field(default_factory=list)


@dataclass
class Rejoin:
    broker: str = ""
    broker_id: int | None = None
    role: str | None = None
    master_id: int | None = None
    master_epoch: int = 0
    #: Where its log ended when it came back, where it was cut, and how much was cut.
    log_end_before: int | None = None
    truncated_at: int | None = None
    truncated_bytes: int | None = None
    #: Where the new master's epoch starts in its own epoch map.
    new_epoch_start: int | None = None
    epoch_map: list[dict[str, int]] = field(default_factory=list)
    matches_master_epochs: bool = False
    as_slave_s: float | None = None
    in_sync_s: float | None = None
    sync_state_set: list[int] = field(default_factory=list)


@dataclass
class DemoSummary:
    messages: int
    body_bytes: int
    sent: int = 0
    acked: int = 0
    not_acked: int = 0
    send_errors: int = 0
    consumed: int = 0
    duplicates: int = 0
    lost: int = 0
    lost_sample: list[int] = field(default_factory=list)
    unacked_but_stored: int = 0
    #: "mutual TLS + ACL", or "cluster secret only" (--plaintext); where the certificates
    #: and accounts are (secured).
    security: str = ""
    certificates: str | None = None
    acl_file: str | None = None
    #: Which clients carried the load, and the proxy they went through (gRPC demo).
    client: str = "rmqha Producer and Consumer over remoting"
    proxy: str | None = None
    #: gRPC demo: sends the demo repeated after the client's own attempts failed, receives
    #: that failed, and acks the proxy refused (those messages come again).
    send_retries: int = 0
    receive_errors: int = 0
    acks_refused: int = 0
    produce_s: float = 0.0
    produce_msgs_per_s: float = 0.0
    produce_mb_per_s: float = 0.0
    consume_s: float = 0.0
    consume_msgs_per_s: float = 0.0
    failover_s: float | None = None
    failover: Failover = field(default_factory=Failover)
    rejoin: Rejoin = field(default_factory=Rejoin)
    processes_started: int = 0
    leftover_processes: list[str] = field(default_factory=list)
    leftover_ports: list[int] = field(default_factory=list)
    directory: str = ""
    kept: bool = False
    total_s: float = 0.0
    interrupted: bool = False
    error: str | None = None
    ok: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)



# --- output ---------------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on stderr, drawn by rich.

    On a terminal it is a live bar (redrawn a few times a second, the demo's other lines
    scrolling above it); anywhere else (a pipe, a file, a CI log) nothing is redrawn: only
    the final line is written, as plain text without escape codes.
    """

    def __init__(self, label: str, total: int, *, console: RichConsole | None = None,
                 enabled: bool = True) -> None:
        self.label, self.total = label, max(total, 1)
        self.console = console if console is not None else RichConsole(
            file=sys.stderr, highlight=False, emoji=False)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal and not self.console.is_dumb_terminal
        self.done = 0
        self.suffix = ""
        self._progress: Progress | None = None
        if self.live:
            # The demo's lines go to stdout: when that is the same terminal, rich prints
            # them above the bar; when it is a pipe they must stay on stdout untouched.
            stdout_tty = sys.stdout.isatty()
            self._progress = Progress(
                TextColumn("{task.description:<10}"), BarColumn(bar_width=30),
                TaskProgressColumn(), MofNCompleteColumn(), TextColumn("{task.fields[suffix]}"),
                console=self.console, transient=True, refresh_per_second=5,
                redirect_stdout=stdout_tty, redirect_stderr=False)
            self._task = self._progress.add_task(label, total=self.total, suffix="")
            self._progress.start()

    def line(self) -> str:
        """The bar as one plain line (what a pipe gets at the end)."""
        pct = min(100, self.done * 100 // self.total)
        return f"{self.label:<10} {pct:3d}% {self.done:,}/{self.total:,} {self.suffix}".rstrip()

    def update(self, done: int, suffix: str = "") -> None:
        self.done, self.suffix = done, suffix
        if self._progress is not None:
            self._progress.update(self._task, completed=min(done, self.total), suffix=suffix)

    def finish(self) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.update(self._task, completed=min(self.done, self.total), suffix=self.suffix)
            self._progress.stop()  # transient: the live bar leaves the screen ...
            self._progress = None
        # ... and one final line stays, on a terminal and in a log alike.
        self.console.file.write(self.line() + "\n")
        self.console.file.flush()


class Console:
    """The demo's human output (stdout), kept clear of a live progress bar on stderr."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: ProgressBar | None = None

    def say(self, text: str = "") -> None:
        if self.quiet:
            return
        # With a live bar on the same terminal, rich has taken over stdout and prints
        # this above the bar.
        print(text, flush=True)

    def progress(self, label: str, total: int) -> ProgressBar:
        self.bar = ProgressBar(label, total, enabled=not self.quiet)
        return self.bar

    def end_progress(self) -> None:
        if self.bar is not None:
            self.bar.finish()
            self.bar = None


def warn(text: str) -> None:
    print(f"rmqha demo: {text}", file=sys.stderr, flush=True)


def ids_text(ids: list[int]) -> str:
    return "{" + ", ".join(str(i) for i in ids) + "}"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"



def _rows(s: DemoSummary) -> Iterator[tuple[str, str, str]]:
    f, r = s.failover, s.rejoin
    yield "messages sent", f"{s.sent:,}", ""
    yield "acknowledged (all-ack)", f"{s.acked:,}", "every replica in the SyncStateSet had it"
    yield "not acknowledged", f"{s.not_acked + s.send_errors:,}", \
        "failed after the producer's retries, or replicas too slow" if s.not_acked + s.send_errors else ""
    yield "consumed (distinct)" if s.proxy is None else "received (distinct)", f"{s.consumed:,}", \
        "" if s.proxy is None else "by the SimpleConsumer, from the first send on"
    twice = "a retried send stored twice (same message id)" if s.proxy is None else \
        "a repeated send stored twice, or a delivery whose ack did not hold"
    yield "duplicates", f"{s.duplicates:,}", twice if s.duplicates else ""
    yield "lost (acknowledged, not read)", f"{s.lost:,}", "MUST be 0" if s.lost else ""
    if s.unacked_but_stored:
        yield "stored without an ack", f"{s.unacked_but_stored:,}", "its ack was lost in the failover"
    if s.proxy is not None:
        yield "client", "RocketMQ 5", f"{s.client} via {s.proxy}, the only address they know"
        yield "sends repeated by the demo", f"{s.send_retries:,}", \
            "after the client's own attempts failed" if s.send_retries else ""
        yield "receives failed / acks refused", f"{s.receive_errors:,} / {s.acks_refused:,}", \
            "their messages are delivered again after their invisible time" if s.acks_refused else ""
    yield "failover: election", _s(f.election_s), "SIGKILL -> controller names a new master"
    yield "failover: first acked write", _s(f.first_ack_s), "SIGKILL -> new master acknowledges"
    yield "master epoch", f"{f.old_epoch} -> {f.new_epoch}", \
        f"master id {f.old_master_id} -> {f.new_master_id}"
    if f.stalled:
        tail = "-" if f.tail_bytes is None else f"{f.tail_bytes:,} bytes"
        yield "unreplicated tail at kill", tail, \
            f"written while the links stalled {_s(f.stall_s)}; lost with the master, never acked"
    cut = "-" if r.truncated_bytes is None else f"{r.truncated_bytes:,} bytes"
    yield "old master cut on rejoin", cut, f"back in sync after {_s(r.in_sync_s)}"
    yield "produce throughput", f"{s.produce_msgs_per_s:,.0f} msg/s", \
        f"{s.produce_mb_per_s:.1f} MB/s of bodies over {s.produce_s:.1f} s, failover included"
    yield "consume throughput", f"{s.consume_msgs_per_s:,.0f} msg/s", f"over {s.consume_s:.1f} s" + (
        "" if s.proxy is None else ", from before the first send to the last message received")
    left = len(s.leftover_processes)
    ports = ", ".join(map(str, s.leftover_ports)) or "none"
    yield "processes stopped", f"{s.processes_started - left} of {s.processes_started}", \
        f"ports still open: {ports}"
    yield "wall time", f"{s.total_s:.1f} s", ""


def format_summary(s: DemoSummary) -> str:
    rows = list(_rows(s))
    w1 = max(len(a) for a, _, _ in rows)
    w2 = max(len(b) for _, b, _ in rows)
    lines = ["", "Summary"]
    lines += [f"  {a:<{w1}}  {b:>{w2}}  {c}".rstrip() for a, b, c in rows]
    return "\n".join(lines)


def verdict(s: DemoSummary) -> str:
    if s.interrupted:
        return "interrupted."
    problems = []
    if s.error:
        problems.append(s.error.splitlines()[0])
    if s.lost:
        problems.append(f"{s.lost:,} acknowledged message(s) missing, e.g. seq {s.lost_sample[:5]}")
    f = s.failover
    if s.error is None and (f.new_master_id is None or f.new_epoch <= f.old_epoch):
        problems.append("no failover to a new master with a higher epoch was seen")
    if s.leftover_processes or s.leftover_ports:
        problems.append(f"left behind: processes {s.leftover_processes}, ports {s.leftover_ports}")
    if problems:
        return "FAILED: " + "; ".join(problems)
    return "OK: every acknowledged message was read back after the failover."

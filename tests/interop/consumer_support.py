"""Consumer interop tests' tools: a Java consumer driver watched while it runs, and the
messages rmqha's own producer sends it.

A push consumer never "ends": :class:`LiveDriver` starts the driver in the background,
reads its JSON lines as they come (a reader thread), lets the test wait on a condition
over what it printed so far (with a deadline; a driver that dies fails the wait at once,
with its stderr), and stops it by creating the stop file the driver polls, after which
the driver shuts its consumers down (offsets persisted) and prints ``stopped``.

:class:`Sent` is what the test knows was acknowledged (SEND_OK from rmqha's
``BlockingProducer``), keyed by the message id the Java client reports (``UNIQ_KEY``), so
a judge can say exactly what is missing, what came twice and what was never sent.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from interop_cluster import InteropCluster

from rmqha.client import BlockingProducer, Message

T = TypeVar("T")
Event = dict[str, Any]


@dataclass
class LiveDriver:
    """A running driver and every JSON object it printed so far."""

    proc: subprocess.Popen[str]
    stop_file: Path
    stderr_log: Path
    events: list[Event] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _reader: threading.Thread | None = None
    _started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, ic: InteropCluster, main_class: str, *args: str, workdir: Path,
              admin: bool = False) -> LiveDriver:
        workdir.mkdir(parents=True, exist_ok=True)
        stop = workdir / "stop"
        stop.unlink(missing_ok=True)
        proc = ic.start(main_class, *args, "--stop-file", str(stop), "--log-dir", str(workdir), admin=admin)
        driver = cls(proc, stop, ic.cluster.log_dir / f"java-{main_class}.log")
        driver._reader = threading.Thread(target=driver._read, name=f"read-{main_class}", daemon=True)
        driver._reader.start()
        return driver

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                event = json.loads(line)
                event["_t"] = round(time.monotonic() - self._started, 3)  # when it arrived, for diagnosis
                with self._lock:
                    self.events.append(event)

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def messages(self) -> list[Event]:
        return [e for e in self.snapshot() if e.get("event") == "msg"]

    def describe(self) -> str:
        err = self.stderr_log.read_text(errors="replace")[-3000:] if self.stderr_log.exists() else ""
        tail = [e for e in self.snapshot() if e.get("event") != "msg"][-10:]
        return (f"driver exit={self.proc.poll()} events={len(self.events)} "
                f"msgs={len(self.messages())}\nlast non-msg events: {tail}\nstderr tail:\n{err}")

    def wait_for(self, condition: Callable[[list[Event]], T], timeout: float, what: str) -> T:
        """Poll ``condition`` over the events until it is truthy; fail with the driver's
        state at the deadline or when the driver exits first."""
        deadline = time.monotonic() + timeout
        while True:
            result = condition(self.snapshot())
            if result:
                return result
            if self.proc.poll() is not None:
                raise AssertionError(f"the driver exited before {what}: {self.describe()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout:.0f} s: {self.describe()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> list[Event]:
        """Ask the driver to shut its consumers down; every event it printed."""
        self.stop_file.touch()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the driver did not stop within {timeout:.0f} s: {self.describe()}") from None
        if self._reader is not None:
            self._reader.join(5)
        events = self.snapshot()
        assert code == 0 and any(e["event"] == "stopped" for e in events), self.describe()
        return events

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> LiveDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


@dataclass
class Sent:
    """The messages the producer saw acknowledged: msg id -> (queue id, queue offset, body)."""

    acked: dict[str, tuple[int, int, str]] = field(default_factory=dict)

    def ids(self) -> set[str]:
        return set(self.acked)

    def per_queue(self) -> dict[int, list[str]]:
        """Bodies per queue id, in queue-offset order."""
        out: dict[int, list[tuple[int, str]]] = {}
        for queue_id, offset, body in self.acked.values():
            out.setdefault(queue_id, []).append((offset, body))
        return {q: [b for _, b in sorted(items)] for q, items in out.items()}


def produce(ic: InteropCluster, topic: str, bodies: Iterable[str], *, queue_id: int | None = None,
            sent: Sent | None = None) -> Sent:
    """Send each body with rmqha's producer (the test's account in tls-acl mode); every
    SEND_OK is recorded, anything else fails the test (nothing here is meant to fail)."""
    sent = sent if sent is not None else Sent()
    with BlockingProducer(ic.namesrv, group="interop-consumer-producer", **ic.client_options()) as producer:
        for body in bodies:
            result = producer.send(topic, Message(body.encode(), keys=body), queue_id=queue_id)
            assert result.ok, f"send of {body} to {topic}: {result}"
            sent.acked[result.msg_id] = (result.queue.queue_id, result.queue_offset, body)
    return sent


@dataclass(frozen=True)
class Verdict:
    """What a consumer got against what was acknowledged."""

    missing: set[str]
    unexpected: set[str]
    duplicates: dict[str, int]

    @classmethod
    def of(cls, sent: Sent, msgs: Iterable[Event]) -> Verdict:
        counts = Counter(m["msgId"] for m in msgs)
        return cls(missing=sent.ids() - set(counts), unexpected=set(counts) - sent.ids(),
                   duplicates={k: n for k, n in counts.items() if n > 1})

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicates)


def received_all(sent: Sent, consumer: int | None = None) -> Callable[[list[Event]], bool]:
    """A wait condition: every acknowledged id arrived (at ``consumer``, or at any)."""
    def condition(events: list[Event]) -> bool:
        got = {e["msgId"] for e in events if e.get("event") == "msg"
               and (consumer is None or e["consumer"] == consumer)}
        return sent.ids() <= got
    return condition


def assignments(events: list[Event]) -> dict[int, set[str]]:
    """Each consumer instance's latest queue set."""
    out: dict[int, set[str]] = {}
    for e in events:
        if e.get("event") == "assignment":
            out[e["consumer"]] = set(e["queues"])
    return out

"""Loopback ports for processes a harness starts, and who holds them.

A port is chosen before the process that binds it starts (:func:`free_port`, below the
kernel's ephemeral range so no outgoing connection takes it, never the same twice from
one process), and another process on the machine (a test on another worker) may take it
in between: :func:`taken_port` finds the port a failed start names, and
:func:`pid_listens`, :func:`port_open` and :func:`live_processes_naming` say who listens
and what still runs (the leftovers check of :class:`rmqha.testing.local_cluster.Cluster`).
"""
from __future__ import annotations

import ipaddress
import os
import random
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from rmqha.errors import LocalClusterError

#: Ports handed out by this process: a port is chosen before its process binds it, so
#: two choices in a row must not return the same one.
_handed_out: set[int] = set()
#: Our own generator, seeded from the OS: a test that seeds the global one (Hypothesis does)
#: must not make two concurrent runs choose the same ports in the same order.
_port_rng = random.Random()


def _below_ephemeral_range() -> range:
    """Ports under the kernel's ephemeral range (Linux ip_local_port_range; else the
    IANA default 49152): the kernel never gives those to an outgoing connection or a
    bind to port 0, so nothing takes a chosen port between its choice and its bind."""
    low = 49152
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return range(max(1024, low - 16384), max(1025, low))


def _bindable(port: int, host: str = "127.0.0.1", *, reuse: bool = False) -> bool:
    """Whether ``host:port`` can be bound now; with ``reuse`` as a server binds it
    (SO_REUSEADDR: a port whose old connections linger in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(count: int = 1) -> int:
    """A TCP port p free on 127.0.0.1 right now (with ``count``, p .. p+count-1 all free),
    never handed out before by this process.

    Chosen below the ephemeral range: a port the kernel picks for ``bind(0)`` (the usual
    trick) is one it may give any outgoing connection a moment later, before the process
    that was to listen on it has started, and on a busy machine that happens."""
    ports = _below_ephemeral_range()
    for _ in range(500):
        p = _port_rng.randrange(ports.start, ports.stop - count + 1)
        block = range(p, p + count)
        if any(q in _handed_out for q in block) or not all(_bindable(q) for q in block):
            continue
        _handed_out.update(block)
        return p
    raise LocalClusterError(f"no {count} consecutive free ports found in {ports}")


#: How many starts in a row a process (a controller group: all its nodes) gets when each
#: exits because a port it was given was taken.
PORT_CLASH_RETRIES = 3
#: What a process logs when a port it was configured with is bound by someone else.
PORT_TAKEN = "is not free (Address already in use)"
#: A line naming a ``host:port`` that could not be bound because another socket holds it:
#: a start's preflight (:data:`PORT_TAKEN`) or a server's own bind a moment later
#: ("cannot listen on host:port: ... address already in use").
_TAKEN_LINE = re.compile(r"[^\s:(]+:(\d+)(?: is not free|:) .*address already in use", re.IGNORECASE)
#: How long a start waits for the ports it was given (not chosen for it) to be free.
PORT_FREE_TIMEOUT = 10.0
#: How much of a start's output is searched for a port-taken line.
_START_OUTPUT_BYTES = 1 << 20


def taken_port(text: str) -> int | None:
    """The port the last port-taken line of ``text`` (a process's output) names, if any."""
    found = _TAKEN_LINE.findall(text)
    return int(found[-1]) if found else None


def free_port_pair() -> int:
    """A port p with p and p+1 both free (a broker's client and default HA port)."""
    return free_port(2)


def port_open(addr: str, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def pid_listens(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` itself holds a socket listening on TCP ``port`` (Linux
    /proc, in the process's own network namespace); None where /proc cannot tell.

    A connection to the port is no proof: another process may have taken the port
    before this one's bind, and it accepts connections meanwhile."""
    if not Path("/proc/self/net/tcp").exists():
        return None
    try:
        sockets = {_link(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        return any(_listening(Path(f"/proc/{pid}/net/{table}"), port) & sockets
                   for table in ("tcp", "tcp6"))
    except (OSError, IndexError, ValueError):
        return False  # it exited meanwhile (a zombie has no network to show)


def _listening(table: Path, port: int) -> set[str]:
    """The sockets (as /proc/PID/fd links name them) listening on ``port`` in a
    /proc/net/tcp table (slow to read on a busy machine: a few ms)."""
    return {inode for sock, inode in _listen_rows(table) if sock.port == port}


@dataclass(frozen=True)
class ListenSocket:
    """One TCP socket a process listens on, as /proc shows it."""

    host: str
    port: int

    @property
    def wildcard(self) -> bool:
        """Whether it listens on every interface (0.0.0.0 or ::)."""
        return self.host in ("0.0.0.0", "::")

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def listening_sockets(pid: int) -> list[ListenSocket]:
    """Every TCP socket process ``pid`` itself listens on (Linux /proc: the listening
    rows of its network namespace's tcp and tcp6 tables whose inode is one of its open
    descriptors), sorted; empty when it exited."""
    try:
        inodes = {_link(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        found = {sock for table in ("tcp", "tcp6")
                 for sock, inode in _listen_rows(Path(f"/proc/{pid}/net/{table}")) if inode in inodes}
    except (OSError, IndexError, ValueError):
        return []
    return sorted(found, key=lambda s: (s.port, s.host))


def _listen_rows(table: Path) -> list[tuple[ListenSocket, str]]:
    """(socket, its fd link name) for the listening rows of a /proc/net/tcp{,6} table."""
    rows = []
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "0A":
            continue
        hex_host, _, hex_port = fields[1].rpartition(":")
        rows.append((ListenSocket(_proc_host(hex_host), int(hex_port, 16)), f"socket:[{fields[9]}]"))
    return rows


def _proc_host(hex_host: str) -> str:
    """/proc's address (32-bit words in host byte order, little-endian here) as text."""
    raw = bytes.fromhex(hex_host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    # ipaddress, not socket.inet_ntop: importing pysyncobj replaces the latter.
    return str(ipaddress.ip_address(words))


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""  # closed meanwhile


def live_processes_naming(directory: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every live process but this one whose command line names
    ``directory`` (Linux /proc; zombies left out): what a test checks a run left behind."""
    needle = str(directory).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state != "Z":
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def _children_naming(directory: Path) -> tuple[list[int], list[int]]:
    """Pids of this process's children running ``-m rmqha ... --config <directory>/...``,
    and pids of its children whose command line is not readable yet (Linux /proc;
    elsewhere none are found).

    A child is in the second list while it is between ``exec`` and its new program's
    first instruction: ``Popen`` returns once the exec has closed the child's
    close-on-exec pipe, but the kernel sets the new command line a little later, and on
    a loaded machine a scan often lands in between (seen in CI)."""
    me, needle = os.getpid(), b"--config\0" + str(directory).encode() + b"/"
    found: list[int] = []
    starting: list[int] = []
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return [], []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        # stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
        fields = stat.rpartition(")")[2].split()
        if len(fields) < 2 or fields[1] != str(me):
            continue
        if b"rmqha\0" in cmdline and needle in cmdline:
            found.append(int(entry.name))
        elif not cmdline and fields[0] != "Z":  # a zombie's is empty for good
            starting.append(int(entry.name))
    return found, starting

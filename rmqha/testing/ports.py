"""Loopback ports for processes a harness starts, and who holds them.

A port is chosen before the process that binds it starts (:func:`free_port`, below the
kernel's ephemeral range so no outgoing connection takes it, never the same twice from
one process), and another process on the machine (a test on another worker) may take it
in between: :func:`taken_port` finds the port a failed start names, and
:func:`pid_listens`, :func:`port_open` and :func:`live_processes_naming` say who listens
and what still runs (the leftovers check of :class:`rmqha.testing.local_cluster.Cluster`).
:func:`tcp_sockets` and :func:`links_to` read a process's connections, and whose the far
end is, from the same one parser of /proc's tcp tables (a partition test's proof that a
cut process reaches nothing on the other side).
"""
from __future__ import annotations

import enum
import ipaddress
import os
import random
import re
import socket
from collections.abc import Mapping
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
    """One TCP endpoint (host and port) as /proc shows it: a socket a process listens on,
    or either end of a connection."""

    host: str
    port: int

    @property
    def wildcard(self) -> bool:
        """Whether it listens on every interface (0.0.0.0 or ::)."""
        return self.host in ("0.0.0.0", "::")

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


#: Either end of a connection is an endpoint of the same shape as a listener.
Endpoint = ListenSocket


class TcpState(enum.IntEnum):
    """The states of /proc/net/tcp's ``st`` column that the checks here read."""

    ESTABLISHED = 0x01
    LISTEN = 0x0A


@dataclass(frozen=True)
class TcpRow:
    """One row of a /proc/net/tcp{,6} table: a socket's two ends, its state and its inode
    (as a /proc/PID/fd link names it)."""

    local: Endpoint
    remote: Endpoint
    state: int
    link: str


@dataclass(frozen=True)
class Link:
    """An established connection of one process whose far end another process holds."""

    local: Endpoint
    remote: Endpoint
    #: The process holding the far end, by pid and the name the caller gave it.
    peer_pid: int
    peer: str

    def __str__(self) -> str:
        return f"{self.local} -> {self.remote} ({self.peer}, pid {self.peer_pid})"


def listening_sockets(pid: int) -> list[ListenSocket]:
    """Every TCP socket process ``pid`` itself listens on (Linux /proc: the listening
    rows of its network namespace's tcp and tcp6 tables whose inode is one of its open
    descriptors), sorted; empty when it exited."""
    found = {row.local for row in tcp_sockets(pid) if row.state == TcpState.LISTEN}
    return sorted(found, key=lambda s: (s.port, s.host))


def tcp_sockets(pid: int) -> list[TcpRow]:
    """Every TCP socket (any state) process ``pid`` holds: the rows of its network
    namespace's tcp and tcp6 tables whose inode is one of its open descriptors; empty
    when it exited."""
    try:
        inodes = {_link(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        return [row for table in ("tcp", "tcp6")
                for row in _tcp_rows(Path(f"/proc/{pid}/net/{table}")) if row.link in inodes]
    except (OSError, IndexError, ValueError):
        return []


def links_to(pid: int, others: Mapping[int, str]) -> list[Link]:
    """The established connections of process ``pid`` whose far end one of ``others``
    (pid -> a name for messages) holds: a socket of it bound to that endpoint, an
    accepted connection or a listener (a wildcard one included).  What a test of a
    partition reads to show that no path of the cut process reaches the other side
    except through what it cut (a proxy's endpoints belong to the proxy's process)."""
    held: dict[Endpoint, int] = {}
    wildcard: dict[int, int] = {}
    for other in others:
        for row in tcp_sockets(other):
            held[row.local] = other
            if row.state == TcpState.LISTEN and row.local.wildcard:
                wildcard[row.local.port] = other
    out = []
    for row in tcp_sockets(pid):
        if row.state != TcpState.ESTABLISHED:
            continue
        peer = held.get(row.remote, wildcard.get(row.remote.port))
        if peer is not None and peer != pid:
            out.append(Link(row.local, row.remote, peer, others[peer]))
    return out


def _listen_rows(table: Path) -> list[tuple[ListenSocket, str]]:
    """(socket, its fd link name) for the listening rows of a /proc/net/tcp{,6} table."""
    return [(row.local, row.link) for row in _tcp_rows(table) if row.state == TcpState.LISTEN]


def _tcp_rows(table: Path) -> list[TcpRow]:
    """Every row of a /proc/net/tcp{,6} table (the one parser of it here)."""
    rows = []
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        rows.append(TcpRow(_endpoint(fields[1]), _endpoint(fields[2]), int(fields[3], 16),
                           f"socket:[{fields[9]}]"))
    return rows


def _endpoint(text: str) -> Endpoint:
    """/proc's ``HEXHOST:HEXPORT`` as an endpoint."""
    hex_host, _, hex_port = text.rpartition(":")
    return Endpoint(_proc_host(hex_host), int(hex_port, 16))


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

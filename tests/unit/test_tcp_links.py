"""rmqha.testing.ports reads a process's connections and whose their far ends are (the
partition check of the chaos suite), from real sockets: a child process that listens,
and this one connected to it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from rmqha.testing.ports import TcpState, links_to, tcp_sockets

_LISTENER = ("import socket,sys;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();"
             "print(s.getsockname()[1],flush=True);c,_=s.accept();sys.stdin.read()")


def test_a_connection_to_another_process_is_named_and_one_to_self_is_not():
    child = subprocess.Popen([sys.executable, "-c", _LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        port = int(child.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as conn, socket.socket() as own:
            own.bind(("127.0.0.1", 0))
            own.listen()
            with socket.create_connection(own.getsockname()) as to_self:
                mine = {row.local.port for row in tcp_sockets(os.getpid()) if row.state == TcpState.ESTABLISHED}
                assert conn.getsockname()[1] in mine and to_self.getsockname()[1] in mine
                links = links_to(os.getpid(), {child.pid: "listener"})
                # Only the link to the child: the far end of the one to itself is its own.
                assert [(link.peer, link.remote.port, link.local.port) for link in links] == \
                    [("listener", port, conn.getsockname()[1])]
                assert links_to(os.getpid(), {}) == []
    finally:
        child.stdin.close()
        child.wait(10)


def test_a_process_that_is_gone_holds_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(10)
    assert tcp_sockets(child.pid) == []

"""An attacker's pickle probe for a controller's Raft port (pysyncobj), shared by the Raft
security tests.

pysyncobj unpickles the first frame of any connection to the Raft port unless something
stops it first (its password, or TLS).  The probe is a pickle whose "payload" creates an
empty marker file: the file appearing is the harmless proof that code ran.
"""
from __future__ import annotations

import pickle
import socket
import struct
import zlib
from pathlib import Path
from typing import Any


class TouchMarker:
    """Unpickling this calls open(marker, "a"): an empty file is the harmless proof that
    code ran.  (The file object it returns is not a node id, so pysyncobj then hangs up:
    either way the probe ends with the connection closed.)"""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "a"))


def raft_frame(message: object) -> bytes:
    """``message`` as pysyncobj frames it without a password: native-endian int length +
    zlib(pickle)."""
    data = zlib.compress(pickle.dumps(message, protocol=2))
    return struct.pack("i", len(data)) + data


def send_probe(raft_address: str, marker: Path) -> bytes:
    """Send the probe in plaintext; returns what the peer sent back before it closed the
    connection."""
    host, _, port = raft_address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # No half-close: pysyncobj drops a connection at EOF before parsing what it read.
        sock.sendall(raft_frame(TouchMarker(marker)))
        received = b""
        while chunk := sock.recv(4096):  # until the controller closes it
            received += chunk
    return received

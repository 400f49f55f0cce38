"""What a test sees of a server from a raw client socket: whether the server closed it."""
from __future__ import annotations

import socket


def peer_closed(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (EOF or reset), without waiting; whatever it
    sent first (a gRPC server's SETTINGS) is read and dropped."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True

"""Raw-socket ceiling: blocking ``sendall`` of a memoryview, ``recv_into`` a preallocated buffer.

The sender times one transfer from its first byte until a 1-byte acknowledgement comes back,
which the receiver sends once the whole payload is in its buffer. Kernel socket buffers are left
at their defaults (autotuned), as a plain Python program would have them.
"""

from __future__ import annotations

import socket
import time
from multiprocessing.connection import Connection
from typing import Any

from _common import checksum, command_loop, make_tensor

ACK = b"\x01"


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    done = 0
    while done < view.nbytes:
        got = sock.recv_into(view[done:])
        if got == 0:
            raise ConnectionError(f"sender closed after {done} of {view.nbytes} bytes")
        done += got


def receiver(conn: Connection, params: dict[str, Any]) -> None:
    """Accept one connection; per repetition receive the payload into one buffer, then ack."""
    size_bytes = params["size_bytes"]
    buffer = memoryview(bytearray(size_bytes))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        conn.send(("ready", {"address": listener.getsockname()[:2]}))
        peer: socket.socket | None = None

        def on_go(index: int) -> dict[str, Any]:
            nonlocal peer
            if peer is None:
                peer, _ = listener.accept()
            _recv_exactly(peer, buffer)
            peer.sendall(ACK)
            return {"checksum": checksum(buffer) if index == 0 else None}

        try:
            command_loop(conn, on_go)
        finally:
            if peer is not None:
                peer.close()
    conn.send(("done", {}))


def sender(conn: Connection, params: dict[str, Any]) -> None:
    """Connect to the receiver; per repetition ``sendall`` the tensor's bytes and wait for the ack."""
    tensor = make_tensor(params["size_bytes"], params["seed"])
    payload = memoryview(tensor.numpy()).cast("B")
    ack = bytearray(1)
    with socket.create_connection(tuple(params["peers"][0]["address"])) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.send(("ready", {}))

        def on_go(index: int) -> dict[str, Any]:
            start = time.perf_counter()
            sock.sendall(payload)
            _recv_exactly(sock, memoryview(ack))
            seconds = time.perf_counter() - start
            return {"seconds": seconds, "checksum": checksum(payload) if index == 0 else None}

        command_loop(conn, on_go)
    conn.send(("done", {}))

"""Encrypted request/response links between two peers over the TCP transport: one TCP connection
carrying one ``crypto.channel`` session opened by the ``crypto.handshake`` exchange, bound to that
connection, one request at a time; a link that failed is closed, never reused (README.md of
peer, "kit.secure_link", has the frames).

- ``message``  the errors, ``LinkMessage``, the packed body and each frame's associated data.
- ``client``   ``SecureLink``: dial, handshake, one request at a time.
- ``server``   ``SecureLinkServer``: pending handshakes, sessions bound to their connection.
- ``links``    ``SecureLinks``: a peer's links by (peer id, method), redialled after a failure.

Errors::

    PeerError
     ├── SecureLinkError    the link failed and is closed (handshake refused, a frame that did not
     │                      verify, timeout, connection lost, peer not in the view)
     └── RequestRefused     the other side refused one request; ``code`` says why, the link lives on"""

from gossamer.peer.kit.secure_link.client import SecureLink
from gossamer.peer.kit.secure_link.links import SecureLinks
from gossamer.peer.kit.secure_link.message import (
    CONFIRM,
    COOKIE,
    ERROR_OP,
    HELLO,
    MAX_OP_CHARS,
    LinkMessage,
    RequestRefused,
    SecureLinkError,
    associated_data,
    pack_body,
    unpack_body,
)
from gossamer.peer.kit.secure_link.server import Authorize, Handler, SecureLinkServer

__all__ = ["CONFIRM", "COOKIE", "ERROR_OP", "HELLO", "MAX_OP_CHARS", "Authorize", "Handler", "LinkMessage", "RequestRefused",
           "SecureLink", "SecureLinkError", "SecureLinkServer", "SecureLinks", "associated_data", "pack_body",
           "unpack_body"]

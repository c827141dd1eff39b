"""Encrypted request/response links between two peers over the TCP transport.

A link is one TCP connection carrying one ``crypto.channel`` session, opened by the
``crypto.handshake`` exchange on that same connection::

    client -> REQUEST  {method, op: "hello", peer: <client peer id>}  payload: hello
    server -> RESPONSE {sid}                                         payload: answer   (a pending handshake)
    client -> REQUEST  {method, op: "confirm", sid}                  payload: confirmation
    server -> RESPONSE {sid}                                         payload: ack      (now a session)
    client -> REQUEST  {method, sid, op, step}   payload: Enc_c2s(body, ad = {sid, op, step, "request"})
    server -> RESPONSE {sid, op, step}           payload: Enc_s2c(body, ad = {sid, op, step, "reply"})

Each side authenticates the other against a key it already knows: the client against the
server's signed peer record (or the run owner's key), the server against the key ``authorize``
returns for the peer id the client claims (and ``authorize`` decides who may talk to it at all).
Both sides contribute a fresh nonce and ephemeral key, the client signs the whole transcript and
each side proves it holds the keys, so a captured hello replayed later opens nothing, and the
peer's live session is replaced only by a completed handshake. A session is bound to the TCP
connection that opened it: a frame naming it from any other connection is refused and leaves it
untouched. A body is a length-prefixed msgpack map ``{fields, tensors}`` followed by the tensors'
raw bytes (``transport.codec``), encrypted whole with ChaCha20-Poly1305; the frame's op and step
ride in the clear header and are bound to the ciphertext as associated data.

Counters are implicit, so frames must be decrypted in the order they were encrypted: a link has
at most one request outstanding (``SecureLink.request`` holds a lock), and a link that failed in
any way (timeout, lost connection, a frame that did not verify) is closed, never reused. A
tampered, replayed or reordered frame on the session's own connection fails to decrypt: the
server drops the session and answers with an error, the client closes the link and raises
``SecureLinkError``. A handler refusing a request (``RequestRefused``) answers with an encrypted
error reply instead; the link stays usable.

- ``message``  the errors, ``LinkMessage``, the packed body and each frame's associated data.
- ``client``   ``SecureLink``: dial, handshake, one request at a time.
- ``server``   ``SecureLinkServer``: pending handshakes, sessions bound to their connection.
- ``links``    ``SecureLinks``: a peer's links by (peer id, method), redialled after a failure.

Errors::

    PeerError
     ├── SecureLinkError    the link failed and is closed (handshake refused, a frame that did not
     │                      verify, timeout, connection lost, peer not in the view)
     └── RequestRefused     the other side refused one request; ``code`` says why, the link lives on
"""

from gossamer.peer.kit.secure_link.client import SecureLink
from gossamer.peer.kit.secure_link.links import SecureLinks
from gossamer.peer.kit.secure_link.message import (
    CONFIRM,
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

__all__ = ["CONFIRM", "ERROR_OP", "HELLO", "MAX_OP_CHARS", "Authorize", "Handler", "LinkMessage", "RequestRefused",
           "SecureLink", "SecureLinkError", "SecureLinkServer", "SecureLinks", "associated_data", "pack_body",
           "unpack_body"]

"""Signed, self-describing objects (peer records, manifests, allowlists): canonical msgpack bodies
signed under a per-purpose domain tag, and ``unpack_limited``, the package's strict msgpack
decoder; every decoding failure is the opaque ``VerificationError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify_signature

SIGNED_DOMAIN = b"gossamer-signed-v1\0"
MAX_DEPTH = 16
DEFAULT_MAX_BYTES = 1 << 20
_FIELDS = frozenset({"body", "pub", "sig"})


def canonical_bytes(obj: Any) -> bytes:
    """msgpack of ``obj`` with every map's keys sorted; TypeError/ValueError for what can't be canonical."""
    try:
        return msgpack.packb(_canonical(obj, 1), use_bin_type=True)
    except OverflowError as exc:  # an int outside msgpack's 64-bit range
        raise ValueError(f"cannot encode canonically: {exc}") from exc


def _canonical(obj: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"object nests deeper than {MAX_DEPTH} levels")
    if obj is None or isinstance(obj, bool | int | float | str | bytes):
        return obj
    if isinstance(obj, list):
        return [_canonical(item, depth + 1) for item in obj]
    if isinstance(obj, dict):
        bad = [key for key in obj if not isinstance(key, str)]
        if bad:
            raise TypeError(f"map keys must be str, got {type(bad[0]).__name__}")
        return {key: _canonical(obj[key], depth + 1) for key in sorted(obj)}
    raise TypeError(f"cannot encode {type(obj).__name__} canonically")


def unpack_limited(
    data: bytes | bytearray | memoryview, *, max_bytes: int, max_depth: int = MAX_DEPTH
) -> Any:
    """Decode exactly one msgpack object from ``data`` under hard caps; VerificationError otherwise."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise VerificationError()
    size_bytes = memoryview(data).nbytes
    if size_bytes > max_bytes:
        raise VerificationError()
    caps = max(size_bytes, 1)  # every element costs at least one byte, so no count can exceed this
    try:
        obj = msgpack.unpackb(
            data,
            strict_map_key=True,
            max_str_len=caps,
            max_bin_len=caps,
            max_array_len=caps,
            max_map_len=caps,
            max_ext_len=0,
        )
    except (
        msgpack.UnpackException,
        ValueError,
        TypeError,
    ) as exc:  # ValueError covers caps, UTF-8, extra data
        raise VerificationError() from exc
    _check_tree(obj, max_depth)
    return obj


def _check_tree(obj: Any, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` and non-str map keys (iterative, no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > max_depth or not all(isinstance(key, str) for key in item):
                raise VerificationError()
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            if depth > max_depth:
                raise VerificationError()
            stack.extend((child, depth + 1) for child in item)


@dataclass(frozen=True)
class SignedBlob:
    """The three parts of a decoded (not yet verified) signed object."""

    body: bytes
    public_key: bytes
    signature: bytes

    def verify(self, domain: bytes) -> None:
        """Check the signature over ``domain + body``; VerificationError if it does not hold."""
        verify_signature(self.public_key, self.signature, domain + self.body)


def seal_body(identity: Identity, body: dict[str, Any], *, domain: bytes) -> bytes:
    """Sign ``body`` (made canonical) under ``domain``; the building block of every signed recipe."""
    if not isinstance(body, dict):
        raise TypeError(f"body must be a dict, got {type(body).__name__}")
    body_bytes = canonical_bytes(body)
    signature = identity.sign(domain + body_bytes)
    return msgpack.packb(
        {"body": body_bytes, "pub": identity.public_key, "sig": signature}, use_bin_type=True
    )


def unwrap(blob: bytes, *, max_bytes: int) -> SignedBlob:
    """Decode the outer map of a signed object, checking field names, types and lengths only."""
    outer = unpack_limited(blob, max_bytes=max_bytes, max_depth=1)
    if not isinstance(outer, dict) or outer.keys() != _FIELDS:
        raise VerificationError()
    body, pub, sig = outer["body"], outer["pub"], outer["sig"]
    if not isinstance(body, bytes) or not isinstance(pub, bytes) or not isinstance(sig, bytes):
        raise VerificationError()
    if len(pub) != PUBLIC_KEY_BYTES or len(sig) != SIGNATURE_BYTES:
        raise VerificationError()
    return SignedBlob(body=body, public_key=pub, signature=sig)


def decode_body(signed: SignedBlob, *, max_bytes: int) -> dict[str, Any]:
    """Decode a signed object's body, which must be a map."""
    body = unpack_limited(signed.body, max_bytes=max_bytes)
    if not isinstance(body, dict):
        raise VerificationError()
    return body


def open_body(
    blob: bytes, *, domain: bytes, max_bytes: int, expected_public_key: bytes | None = None
) -> tuple[dict[str, Any], bytes]:
    """Verify a signed object made by ``seal_body`` under ``domain``; returns (body, public_key)."""
    signed = unwrap(blob, max_bytes=max_bytes)
    if expected_public_key is not None and signed.public_key != expected_public_key:
        raise VerificationError()
    signed.verify(domain)
    return decode_body(signed, max_bytes=max_bytes), signed.public_key


def sign_object(identity: Identity, body: dict[str, Any]) -> bytes:
    """Sign a record/manifest/allowlist body; ``open_signed`` checks the result."""
    return seal_body(identity, body, domain=SIGNED_DOMAIN)


def open_signed(
    blob: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, expected_public_key: bytes | None = None
) -> tuple[dict[str, Any], bytes]:
    """Verify an object made by ``sign_object``; returns (body, public_key) or raises VerificationError."""
    return open_body(blob, domain=SIGNED_DOMAIN, max_bytes=max_bytes, expected_public_key=expected_public_key)

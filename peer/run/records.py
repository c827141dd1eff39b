"""Signed peer records, published under ``run/<run id>/peers/<peer id>``: readers drop anything
unsigned, mis-signed, under another's subkey, expired, from the future or announcing an address
nobody can dial; ``peer_row`` is one row of a live peer table (README.md of peer, "run.records")."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity, peer_id_of
from gossamer.crypto.signed import open_signed, sign_object
from gossamer.peer.errors import RecordRejected
from gossamer.peer.run.addresses import unusable_address

MAX_RECORD_BYTES = 16 * 1024
MAX_CLOCK_SKEW_S = 30.0
MAX_TENURED = 128
TENURED_ID_HEX = 16
_TENURED_ID = re.compile(rf"[0-9a-f]{{{TENURED_ID_HEX}}}")
UNKNOWN, PUBLIC, PRIVATE, RELAYED = "unknown", "public", "private", "relayed"
REACHABILITY = (UNKNOWN, PUBLIC, PRIVATE, RELAYED)
"""What a record's ``reachability`` says (``peer.reach``): not checked yet; others dialled its
addresses back; they could not; private, and its addresses are a relay's that forwards to it."""


@dataclass(frozen=True, kw_only=True)
class PeerRecord:
    """One peer's published state. Addresses are ``host:port`` strings ("" when not served)."""

    peer_id: str
    public_key: bytes
    name: str
    http_addr: str
    tcp_addr: str
    roles: tuple[str, ...]
    version: str
    round: int
    timestamp: float
    assignment: dict[str, Any] = field(default_factory=dict)
    capacity: dict[str, Any] = field(default_factory=dict)
    join_token: str = ""
    state: dict[str, Any] = field(default_factory=dict)  # {"version": int, "digest": hex} for state donors
    tenured: tuple[str, ...] = ()  # the run owner's: peer id prefixes it has seen live for the run's tenure
    reachability: str = UNKNOWN  # one of REACHABILITY
    relay: str = ""  # "host:port" of the relay service this peer volunteers ("" if none)
    run_round: int = 0  # the run owner's: the highest round the run's steering members announced

    @property
    def reachable(self) -> bool:
        """Whether others can dial this peer's addresses (directly, or through its relay)."""
        return self.reachability != PRIVATE

    def body(self) -> dict[str, Any]:
        body = asdict(self)
        body["roles"] = list(self.roles)
        body["tenured"] = list(self.tenured)
        return body


def seal_record(identity: Identity, record: PeerRecord) -> bytes:
    """Sign ``record`` with ``identity``; refuses a record that claims another peer's id or key."""
    if record.public_key != identity.public_key or record.peer_id != identity.peer_id:
        raise ValueError("a peer may only sign its own record")
    return sign_object(identity, record.body())


def open_record(blob: bytes, *, subkey: str, now: float, ttl_s: float) -> PeerRecord:
    """Verify and decode a record found under ``subkey``; raise RecordRejected with the reason."""
    record = read_record(blob, subkey=subkey)
    check_record_time(record, now=now, ttl_s=ttl_s)
    return record


def read_record(blob: bytes, *, subkey: str) -> PeerRecord:
    """What ``open_record`` checks that does not depend on the time: signature, identity, subkey,
    fields, addresses (the DHT's key rule refuses the rest before it stores or believes one)."""
    try:
        body, public_key = open_signed(blob, max_bytes=MAX_RECORD_BYTES)
    except VerificationError as exc:
        raise RecordRejected("record is unsigned or its signature does not verify", reason="signature") from exc
    record = _record_from_body(body)
    if record.public_key != public_key or record.peer_id != peer_id_of(public_key):
        raise RecordRejected("record's peer id does not match the key that signed it", reason="identity")
    if subkey != record.peer_id:
        raise RecordRejected(f"record for {record.peer_id[:12]} was published under subkey {subkey[:12]!r}", reason="identity")
    for addr in (record.http_addr, record.tcp_addr, record.relay):
        if problem := unusable_address(addr):
            raise RecordRejected(f"record of {record.peer_id[:12]}: {problem}", reason="address")
    return record


def check_record_time(record: PeerRecord, *, now: float, ttl_s: float) -> None:
    """RecordRejected when ``record`` expired (older than ``ttl_s``) or is dated in the future."""
    if now - record.timestamp > ttl_s:
        raise RecordRejected(f"record of {record.peer_id[:12]} expired {now - record.timestamp - ttl_s:.1f}s ago", reason="expired")
    if record.timestamp - now > MAX_CLOCK_SKEW_S:
        raise RecordRejected(f"record of {record.peer_id[:12]} is dated {record.timestamp - now:.1f}s in the future", reason="future")


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "peer_id": str, "public_key": bytes, "name": str, "http_addr": str, "tcp_addr": str,
    "roles": list, "version": str, "round": int, "timestamp": (int, float),
    "assignment": dict, "capacity": dict, "join_token": str, "state": dict, "tenured": list,
    "reachability": str, "relay": str, "run_round": int,
}
_OPTIONAL = {"tenured": [], "reachability": UNKNOWN, "relay": "", "run_round": 0}  # fields records of earlier versions lack


def _record_from_body(body: dict[str, Any]) -> PeerRecord:
    body = {**_OPTIONAL, **body}
    missing = [name for name in _FIELD_TYPES if name not in body]
    if missing:
        raise RecordRejected(f"record is missing fields {missing}", reason="malformed")
    for name, kind in _FIELD_TYPES.items():
        if not isinstance(body[name], kind) or (isinstance(body[name], bool) and kind is int):
            raise RecordRejected(f"record field {name!r} has type {type(body[name]).__name__}", reason="malformed")
    if not all(isinstance(role, str) for role in body["roles"]):
        raise RecordRejected("record field 'roles' must be a list of strings", reason="malformed")
    tenured = body["tenured"]
    if len(tenured) > MAX_TENURED or not all(isinstance(t, str) and _TENURED_ID.fullmatch(t) for t in tenured):
        raise RecordRejected(f"record field 'tenured' must be at most {MAX_TENURED} peer id prefixes",
                             reason="malformed")
    if body["round"] < 0 or body["run_round"] < 0:
        raise RecordRejected("record fields 'round' and 'run_round' must not be negative", reason="malformed")
    if body["reachability"] not in REACHABILITY:
        raise RecordRejected(f"record field 'reachability' must be one of {REACHABILITY}", reason="malformed")
    fields = {name: body[name] for name in _FIELD_TYPES}
    fields["roles"] = tuple(body["roles"])
    fields["tenured"] = tuple(tenured)
    fields["timestamp"] = float(body["timestamp"])
    return PeerRecord(**fields)


def peer_row(record: PeerRecord, now: float) -> dict[str, Any]:
    """One row of a live peer table (``/status`` and ``gossamer status``)."""
    return {"peer_id": record.peer_id, "name": record.name, "roles": list(record.roles), "round": record.round,
            "http_addr": record.http_addr, "tcp_addr": record.tcp_addr, "version": record.version,
            "reachability": record.reachability,
            "device": record.capacity.get("device_name") or record.capacity.get("device", ""),
            "assignment": dict(record.assignment), "last_seen_s": round(max(0.0, now - record.timestamp), 1)}

"""The DHT keys of a run (``run/<run id>/manifest``, ``run/<run id>/peers``) and ``RunKeys``, the
``KeyRule`` every daemon's DHT node applies: no other key exists, the manifest key holds the owner's
signed manifest and the peers key signed records of at most 16 KiB, each living at most the run's
TTL; a node stores a record of a run it is part of only when it verifies and is admitted now."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from gossamer.peer.errors import ConfigError, ManifestError, RecordRejected
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import MAX_TTL_S, Manifest, parse_run_id, verify_manifest
from gossamer.peer.run.records import (
    MAX_CLOCK_SKEW_S,
    MAX_RECORD_BYTES,
    PeerRecord,
    check_record_time,
    read_record,
)
from gossamer.transport.dht import Entry, EntryRefused

_RUN_KEY = re.compile(r"run/([^/]{1,128})/(manifest|peers)")
MAX_LEARNED_RUNS = 64


def manifest_key(run_id: str) -> str:
    return f"run/{run_id}/manifest"


def peers_key(run_id: str) -> str:
    return f"run/{run_id}/peers"


@dataclass(frozen=True)
class _KnownRun:
    ttl_s: float
    admission: Admission


class RunKeys:
    """The ``KeyRule`` of gossamer runs (see the module docstring); ``learn`` the manifest of the
    run this node is part of: its entries are then capped at its own TTL, and its records are
    stored only when they verify and its admission policy admits them (other runs' keys are
    strangers' to this node: ``transport.dht.storage`` keeps little of them, for a short time)."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, _KnownRun] = OrderedDict()

    def learn(self, manifest: Manifest) -> None:
        self._runs[manifest.run_id] = _KnownRun(ttl_s=manifest.ttl_s, admission=Admission(manifest))
        self._runs.move_to_end(manifest.run_id)
        while len(self._runs) > MAX_LEARNED_RUNS:
            self._runs.popitem(last=False)

    def check(self, key: str, entry: Entry) -> None:
        """For every entry stored or read (nothing here depends on the time or on admission)."""
        run_id, kind = _parse(key)
        known = self._runs.get(run_id)
        limit_s = (known.ttl_s if known is not None else MAX_TTL_S) + MAX_CLOCK_SKEW_S
        if entry.expires_at - entry.signed_at > limit_s:
            raise EntryRefused(f"entry under {key} lives {entry.expires_at - entry.signed_at:.0f} s, over the run's "
                               f"record lifetime {limit_s:.0f} s", reason="lifetime")
        if kind == "manifest":
            _check_manifest(run_id, entry)
        elif entry.payload:
            _read_record(key, entry)

    def admit(self, key: str, entry: Entry, *, now: float) -> bool:
        """When this node is asked to store ``entry``: True for a run it is part of, whose record must
        be current and admitted (EntryRefused otherwise); False for any other run."""
        run_id, kind = _parse(key)
        known = self._runs.get(run_id)
        if known is None:
            return False
        if kind == "peers" and entry.payload:
            record = _read_record(key, entry)
            try:
                check_record_time(record, now=now, ttl_s=known.ttl_s)
                known.admission.check(record, now=now)
            except RecordRejected as exc:
                raise EntryRefused(f"under {key}: {exc}",
                                   reason="admission" if exc.reason == "policy" else "record") from exc
        return True


def _parse(key: str) -> tuple[str, str]:
    match = _RUN_KEY.fullmatch(key)
    if match is None:
        raise EntryRefused(f"{key[:80]!r} is not a key of a gossamer run", reason="unknown-key")
    run_id, kind = match.groups()
    try:
        parse_run_id(run_id)
    except ConfigError as exc:
        raise EntryRefused(f"{run_id[:80]!r} is not a run id", reason="unknown-key") from exc
    return run_id, kind


def _check_manifest(run_id: str, entry: Entry) -> None:
    """Only the owner writes the manifest key, and only the run's manifest (or a tombstone)."""
    if not entry.subkey.startswith(parse_run_id(run_id)[1]):
        raise EntryRefused(f"only the owner of run {run_id} may write its manifest key", reason="not-owner")
    if entry.payload:
        try:
            verify_manifest(entry.payload, expected_run_id=run_id)
        except ManifestError as exc:
            raise EntryRefused(f"under the manifest key of {run_id}: {exc}", reason="manifest") from exc


def _read_record(key: str, entry: Entry) -> PeerRecord:
    if len(entry.payload) > MAX_RECORD_BYTES:
        raise EntryRefused(f"a record of {len(entry.payload)} bytes under {key}, over {MAX_RECORD_BYTES}",
                           reason="size")
    try:
        return read_record(entry.payload, subkey=entry.subkey)
    except RecordRejected as exc:
        raise EntryRefused(f"under {key}: {exc}", reason="record") from exc

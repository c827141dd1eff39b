"""The DHT keys of a run (``run/<run id>/manifest``, ``run/<run id>/peers``) and ``RunKeys``, the
``KeyRule`` every daemon's DHT node applies: no other key exists, the manifest key takes only the
owner's subkey, and an entry lives at most the run's record TTL plus the allowed clock skew."""

from __future__ import annotations

import re

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import MAX_TTL_S, Manifest, parse_run_id
from gossamer.peer.run.records import MAX_CLOCK_SKEW_S
from gossamer.transport.dht import Entry, EntryRefused

_RUN_KEY = re.compile(r"run/([^/]{1,128})/(manifest|peers)")
MAX_LEARNED_RUNS = 64


def manifest_key(run_id: str) -> str:
    return f"run/{run_id}/manifest"


def peers_key(run_id: str) -> str:
    return f"run/{run_id}/peers"


class RunKeys:
    """The ``KeyRule`` of gossamer runs (see the module docstring); ``learn`` a run's manifest to
    cap its entries' lifetime at its own TTL."""

    def __init__(self) -> None:
        self._ttl_s: dict[str, float] = {}

    def learn(self, manifest: Manifest) -> None:
        self._ttl_s[manifest.run_id] = manifest.ttl_s
        while len(self._ttl_s) > MAX_LEARNED_RUNS:
            self._ttl_s.pop(next(iter(self._ttl_s)))

    def check(self, key: str, entry: Entry) -> None:
        match = _RUN_KEY.fullmatch(key)
        if match is None:
            raise EntryRefused(f"{key[:80]!r} is not a key of a gossamer run", reason="unknown-key")
        run_id, kind = match.groups()
        try:
            _name, owner_prefix = parse_run_id(run_id)
        except ConfigError as exc:
            raise EntryRefused(f"{run_id[:80]!r} is not a run id", reason="unknown-key") from exc
        if kind == "manifest" and not entry.subkey.startswith(owner_prefix):
            raise EntryRefused(f"only the owner of run {run_id} may write its manifest key", reason="not-owner")
        limit_s = self._ttl_s.get(run_id, MAX_TTL_S) + MAX_CLOCK_SKEW_S
        if entry.expires_at - entry.signed_at > limit_s:
            raise EntryRefused(f"entry under {key} lives {entry.expires_at - entry.signed_at:.0f} s, over the run's "
                               f"record lifetime {limit_s:.0f} s", reason="lifetime")

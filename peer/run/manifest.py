"""Run configs (TOML: ``[run]``, ``[model]``, ``[data]``, ``[hyper]``, ``[admission]``, ``[peer]``)
and signed run manifests. The run id ``<name>@<16 hex of the owner's peer id>`` lets a joiner
that knows only the id check that a manifest is the owner's (README.md of peer, "run.manifest")."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity, peer_id_of
from gossamer.crypto.signed import open_signed, sign_object
from gossamer.peer.config import read_toml
from gossamer.peer.errors import ConfigError, ManifestError

RUN_ID_KEY_HEX = 16
MIN_HEARTBEAT_S, MAX_HEARTBEAT_S = 0.2, 600.0
TTL_HEARTBEATS = 3
TENURE_HEARTBEATS = 12
MAX_TENURE_S = 7 * 24 * 3600.0
MAX_TTL_S = TTL_HEARTBEATS * MAX_HEARTBEAT_S
MAX_MANIFEST_BYTES = 48 * 1024
POLICIES = ("open", "allowlist")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def make_run_id(name: str, owner_public_key: bytes) -> str:
    """``<name>@<owner fingerprint prefix>``."""
    return f"{name}@{peer_id_of(owner_public_key)[:RUN_ID_KEY_HEX]}"


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A parsed run config (see the module docstring for the TOML layout)."""

    name: str
    protocol: str = "none"
    description: str = ""
    heartbeat_s: float = 5.0
    tenure_s: float | None = None
    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    hyper: dict[str, Any] = field(default_factory=dict)
    policy: str = "open"
    allow: tuple[str, ...] = ()
    peer: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"run.name {self.name!r} must be 1-64 characters of letters, digits, '.', '_', '-'")
        if not _NAME.match(self.protocol):
            raise ConfigError(f"run.protocol {self.protocol!r} is not a protocol name (see gossamer --help)")
        if not isinstance(self.heartbeat_s, int | float) or not MIN_HEARTBEAT_S <= self.heartbeat_s <= MAX_HEARTBEAT_S:
            raise ConfigError(f"run.heartbeat_s must be a number of seconds in [{MIN_HEARTBEAT_S}, {MAX_HEARTBEAT_S:.0f}], "
                              f"got {self.heartbeat_s!r}")
        if self.tenure_s is not None and (isinstance(self.tenure_s, bool) or not isinstance(self.tenure_s, int | float)
                                          or not 0 < self.tenure_s <= MAX_TENURE_S):
            raise ConfigError(f"run.tenure_s must be a number of seconds in (0, {MAX_TENURE_S:.0f}], "
                              f"got {self.tenure_s!r}")
        if self.policy not in POLICIES:
            raise ConfigError(f"admission.policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        for key in self.allow:
            if not re.fullmatch(r"[0-9a-f]{64}", key):
                raise ConfigError(f"admission.allow entry {key!r} is not a 64-hex-digit Ed25519 public key")


def load_run_config(path: str | Path) -> RunConfig:
    """Read a run config TOML file; ConfigError names the file and the problem."""
    return run_config_from_dict(read_toml(path, what="run config"), source=str(path))


def run_config_from_dict(doc: dict[str, Any], *, source: str = "run config") -> RunConfig:
    run = _table(doc, "run", source)
    admission = _table(doc, "admission", source)
    if "name" not in run:
        raise ConfigError(f"{source}: [run] needs a name")
    return RunConfig(
        name=str(run["name"]), protocol=str(run.get("protocol", "none")),
        description=str(run.get("description", "")), heartbeat_s=run.get("heartbeat_s", 5.0),
        tenure_s=run.get("tenure_s"), model=_table(doc, "model", source),
        data=_table(doc, "data", source), hyper=_table(doc, "hyper", source),
        policy=str(admission.get("policy", "open")), allow=tuple(str(k).lower() for k in admission.get("allow", ())),
        peer=_table(doc, "peer", source),
    )


def _table(doc: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{name}] must be a table")
    return value


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A verified manifest: everything a peer needs to take part in a run."""

    run_id: str
    owner_public_key: bytes
    config: RunConfig
    created_at: float
    blob: bytes  # the signed bytes, republished verbatim

    @property
    def ttl_s(self) -> float:
        """How long a peer record stays valid: three heartbeats of the run."""
        return TTL_HEARTBEATS * self.config.heartbeat_s

    @property
    def tenure_s(self) -> float:
        """How long a peer must have been live to steer others' choices (``peer.run.tenure``)."""
        if self.config.tenure_s is not None:
            return float(self.config.tenure_s)
        return TENURE_HEARTBEATS * self.config.heartbeat_s

    @property
    def owner_peer_id(self) -> str:
        return peer_id_of(self.owner_public_key)


def build_manifest(owner: Identity, config: RunConfig, *, now: float) -> Manifest:
    """Sign ``config`` as a manifest with the owner's key."""
    body = {
        "kind": "gossamer/manifest", "format": 1, "run_id": make_run_id(config.name, owner.public_key),
        "owner_public_key": owner.public_key, "name": config.name, "protocol": config.protocol,
        "description": config.description, "heartbeat_s": float(config.heartbeat_s),
        "tenure_s": None if config.tenure_s is None else float(config.tenure_s), "model": config.model, "data": config.data, "hyper": config.hyper,
        "admission": {"policy": config.policy, "allow": list(config.allow)}, "created_at": float(now),
    }
    blob = sign_object(owner, body)
    if len(blob) > MAX_MANIFEST_BYTES:
        raise ConfigError(f"run config is too large for a manifest ({len(blob)} > {MAX_MANIFEST_BYTES} bytes)")
    return verify_manifest(blob, expected_run_id=body["run_id"])


def verify_manifest(blob: bytes, *, expected_run_id: str) -> Manifest:
    """Check the signature, the owner fingerprint in the run id, and the body; ManifestError otherwise."""
    try:
        body, signer = open_signed(blob, max_bytes=MAX_MANIFEST_BYTES)
    except VerificationError as exc:
        raise ManifestError(f"manifest for run {expected_run_id} has an invalid signature; refusing to join") from exc
    if body.get("kind") != "gossamer/manifest" or body.get("owner_public_key") != signer:
        raise ManifestError(f"manifest for run {expected_run_id} is not signed by its stated owner")
    if make_run_id(str(body.get("name")), signer) != expected_run_id or body.get("run_id") != expected_run_id:
        raise ManifestError(
            f"manifest is for run {body.get('run_id')!r}, signed by {peer_id_of(signer)[:16]}; "
            f"it does not match the run id {expected_run_id!r} you asked to join"
        )
    admission = body.get("admission") if isinstance(body.get("admission"), dict) else {}
    try:
        config = run_config_from_dict({
            "run": {k: body.get(k) for k in ("name", "protocol", "description", "heartbeat_s", "tenure_s")
                    if body.get(k) is not None},
            "model": body.get("model", {}), "data": body.get("data", {}), "hyper": body.get("hyper", {}),
            "admission": admission,
        }, source=f"manifest of {expected_run_id}")
    except ConfigError as exc:
        raise ManifestError(str(exc)) from exc
    created_at = body.get("created_at")
    if not isinstance(created_at, float):
        raise ManifestError(f"manifest of {expected_run_id} has no creation time")
    return Manifest(run_id=expected_run_id, owner_public_key=signer, config=config, created_at=created_at, blob=blob)


def parse_run_id(run_id: str) -> tuple[str, str]:
    """Split ``name@prefix``; ConfigError when malformed."""
    name, sep, prefix = run_id.partition("@")
    if not sep or not _NAME.match(name) or not re.fullmatch(rf"[0-9a-f]{{{RUN_ID_KEY_HEX}}}", prefix):
        raise ConfigError(f"run id {run_id!r} must look like NAME@{'0' * RUN_ID_KEY_HEX} (name @ owner key prefix)")
    return name, prefix

"""Run configs and manifests: the run id binds the owner key; a wrong signature is refused."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import sign_object
from gossamer.peer.errors import ConfigError, ManifestError
from gossamer.peer.run.manifest import (
    RunConfig,
    build_manifest,
    load_run_config,
    make_run_id,
    parse_run_id,
    verify_manifest,
)
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

NOW = 1_800_000_000.0


def test_run_id_is_name_at_owner_prefix() -> None:
    owner = Identity.generate()
    run_id = make_run_id("demo", owner.public_key)
    assert run_id == f"demo@{owner.peer_id[:16]}"
    assert parse_run_id(run_id) == ("demo", owner.peer_id[:16])


def test_manifest_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[run]\nname = "r1"\nprotocol = "diloco"\n[hyper]\nlr = 0.1\n[admission]\npolicy = "open"\n')
    owner = Identity.generate()
    manifest = build_manifest(owner, load_run_config(path), now=NOW)
    again = verify_manifest(manifest.blob, expected_run_id=manifest.run_id)
    assert again.config.hyper == {"lr": 0.1} and again.config.protocol == "diloco"
    assert again.owner_peer_id == owner.peer_id


def test_manifest_signed_by_someone_else_is_refused() -> None:
    owner, mallory = Identity.generate(), Identity.generate()
    real = build_manifest(owner, RunConfig(name="r"), now=NOW)
    # mallory re-signs the same body with her own key but keeps the owner's run id
    from gossamer.crypto.signed import open_signed
    body, _ = open_signed(real.blob)
    body["owner_public_key"] = mallory.public_key
    forged = sign_object(mallory, body)
    with pytest.raises(ManifestError, match="does not match the run id"):
        verify_manifest(forged, expected_run_id=real.run_id)


def test_tampered_manifest_is_refused() -> None:
    real = build_manifest(Identity.generate(), RunConfig(name="r"), now=NOW)
    tampered = bytearray(real.blob)
    tampered[len(tampered) // 2] ^= 0x01
    with pytest.raises(ManifestError, match="invalid signature"):
        verify_manifest(bytes(tampered), expected_run_id=real.run_id)


@pytest.mark.parametrize("doc, field", [
    ('[run]\nname = "bad name"\n', "run.name"),
    ('[run]\nname = "ok"\nprotocol = "no pe"\n', "run.protocol"),
    ('[run]\nname = "ok"\n[admission]\npolicy = "closed"\n', "admission.policy"),
    ('[run]\nname = "ok"\n[admission]\npolicy = "allowlist"\nallow = ["zz"]\n', "admission.allow"),
    ('[run]\n', "needs a name"),
    ('[run\nname=1', "not valid TOML"),
])
def test_bad_run_configs_name_the_field(tmp_path: Path, doc: str, field: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(doc)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_run_config(path)


@pytest.mark.parametrize("run_id", ["demo", "demo@xyz", "@0123456789abcdef", "a b@0123456789abcdef"])
def test_malformed_run_ids(run_id: str) -> None:
    with pytest.raises(ConfigError):
        parse_run_id(run_id)


async def test_the_orchestrator_serves_the_manifest_as_json_and_signed_bytes(tmp_path: Path) -> None:
    """``GET /manifest`` answers JSON (the run, its owner, its tables, and the signed bytes in
    base64); ``?format=signed`` the signed bytes themselves. Both verify as this run's manifest."""
    run = {"run": {"name": "served", "protocol": "diloco", "description": "a run to read"},
           "hyper": {"rounds": 3, "batch_size": 8}, "admission": {"policy": "open"}}
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=tmp_path)
    try:
        peer = await net.add("owner", ("orchestrator",))
        url = f"http://{peer.http_addr}/manifest"
        plain, signed = await asyncio.to_thread(fetch, url), await asyncio.to_thread(fetch, f"{url}?format=signed")
    finally:
        await net.aclose()
    (content_type, body), (signed_type, blob) = plain, signed
    manifest = net.manifest
    assert content_type.startswith("application/json") and signed_type == "application/octet-stream"
    document = json.loads(body)
    assert document["run_id"] == manifest.run_id and document["owner_peer_id"] == net.owner.peer_id
    assert document["owner_public_key"] == net.owner.public_key.hex()
    assert document["run"] == {"name": "served", "protocol": "diloco", "description": "a run to read",
                               "heartbeat_s": manifest.config.heartbeat_s}
    assert document["hyper"] == {"rounds": 3, "batch_size": 8}
    assert document["admission"] == {"policy": "open", "allow": []}
    assert base64.b64decode(document["signed_base64"]) == blob == manifest.blob
    assert verify_manifest(blob, expected_run_id=manifest.run_id).config == manifest.config


def fetch(url: str) -> tuple[str, bytes]:
    """(Content-Type, body) of a GET."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read()

"""Roles mark status fields private (issue 21): a real daemon's ``/status`` and ``/metrics`` show
them to the peer's owner (this host; the HTTP path here is loopback) and leave them out for anyone
else, naming what was withheld; fields a role does not mark stay public. The protocol is a toy
written here (the generic code never names one)."""

from __future__ import annotations

import asyncio
import importlib
import json
import urllib.request
from pathlib import Path

import pytest

from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.registry import PLUGINS

pytestmark = pytest.mark.timeout(120)

TOY = '''
from dataclasses import dataclass

from gossamer.peer.plugin import ProtocolPlugin
from gossamer.peer.role import ProtocolRole


@dataclass(frozen=True, kw_only=True)
class SecretSettings:
    pass


class SecretRole(ProtocolRole[SecretSettings]):
    name = "secretive"
    ends = False
    private_status = frozenset({"series", "batch", "toy_loss"})

    def status(self):
        return {"step": 7, "series": [0.9, 0.5], "batch": ["node-a", "node-b"]}

    def gauges(self):
        return {"toy_step": 7.0, "toy_loss": 0.5}


PLUGIN = ProtocolPlugin(name="secrets", summary="toy: a role with private status", settings=lambda: SecretSettings,
                        roles=("secretive",), load_roles=lambda: {"secretive": SecretRole})
'''


def get(daemon: Daemon, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http.address[1]}{path}", timeout=10) as answer:
        return answer.read()


async def test_private_status_fields_reach_the_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gossamer_toy_secrets.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = PLUGINS.extended(importlib.import_module("gossamer_toy_secrets").PLUGIN)
    run = RunConfig(name="secrets", protocol="secrets", heartbeat_s=1.0)
    config = PeerConfig(identity_path=tmp_path / "owner.pem", host="127.0.0.1", host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                        new_swarm=True, roles=("orchestrator", "secretive"))
    daemon = await Daemon.create(config, plugins=registry, run_config=run)
    try:
        served = json.loads(await asyncio.to_thread(get, daemon, "/status"))
        served_metrics = (await asyncio.to_thread(get, daemon, "/metrics")).decode()
        public = daemon.status(owner=False)
        public_metrics = daemon.metrics.render(owner=False).decode()
    finally:
        await daemon.aclose()

    assert served["role_status"]["secretive"] == {"step": 7, "series": [0.9, 0.5], "batch": ["node-a", "node-b"]}
    assert served["withheld"] == {}
    assert "gossamer_toy_loss 0.5" in served_metrics and "gossamer_toy_step 7.0" in served_metrics
    assert public["role_status"]["secretive"] == {"step": 7}
    assert public["withheld"] == {"secretive": ["batch", "series", "toy_loss"]}
    assert "gossamer_toy_loss" not in public_metrics and "gossamer_toy_step 7.0" in public_metrics
    assert "node-a" not in json.dumps(public)

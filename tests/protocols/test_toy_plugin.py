"""Adding a protocol touches nothing generic: a toy protocol written here, in a temporary module,
runs through real daemons (a real hivemind DHT, real HTTP) with its own settings read from the
signed manifest, its own role, route and event, using only ``PluginRegistry.extended``."""

from __future__ import annotations

import asyncio
import importlib
import json
from pathlib import Path

import pytest

from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.registry import PLUGINS

pytestmark = pytest.mark.timeout(120)

TOY = '''
"""A toy protocol: every echoer asks every other echoer for its greeting, once."""

from dataclasses import dataclass

from aiohttp import web

from gossamer.protocols.core.settings import setting
from gossamer.peer.plugin import EventSchema, ProtocolPlugin
from gossamer.peer.role import ProtocolRole


@dataclass(frozen=True, kw_only=True)
class EchoSettings:
    greeting: str = setting("hello", table="hyper")
    peers: int = setting(2, table="hyper", low=1)


class EchoRole(ProtocolRole[EchoSettings]):
    name = "echoer"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.heard = {}

    def routes(self):
        return [web.get("/echo/greeting", self._greet)]

    async def _greet(self, request):
        return web.json_response({"greeting": self.settings.greeting, "from": self.peer_id})

    async def start(self):
        self.spawn(self._listen(), name="listen")

    async def _listen(self):
        wanted = self.settings.peers - 1
        await self.ctx.until_view(lambda: len(self.peers_with("echoer")) >= wanted, timeout_s=60)
        for peer in self.peers_with("echoer"):
            answer = await self.ctx.http_client.get_json(f"http://{peer.record.http_addr}/echo/greeting")
            self.heard[peer.record.peer_id] = answer["greeting"]
            self.emit("heard", peer=peer.record.peer_id, greeting=answer["greeting"])


PLUGIN = ProtocolPlugin(name="echo", summary="toy: peers greet each other", settings=lambda: EchoSettings,
                        roles=("echoer",), load_roles=lambda: {"echoer": EchoRole}, events={"heard": EventSchema("a greeting", ("peer", "greeting"))})
'''


def config(tmp_path: Path, name: str, **changes) -> PeerConfig:
    return PeerConfig(identity_path=tmp_path / f"{name}.pem", host="127.0.0.1", host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                      public_name=name, **changes)


async def test_a_toy_protocol_runs_through_real_daemons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gossamer_toy_echo.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("gossamer_toy_echo")
    registry = PLUGINS.extended(toy.PLUGIN)
    run = RunConfig(name="echo", protocol="echo", heartbeat_s=1.0, hyper={"greeting": "bonjour"})

    owner = await Daemon.create(config(tmp_path, "owner", new_swarm=True, roles=("orchestrator", "echoer")),
                                plugins=registry, run_config=run)
    daemons = [owner]
    try:
        join = {"run": owner.manifest.run_id, "initial_peers": tuple(owner.membership.visible_maddrs())}
        joiner = await Daemon.create(config(tmp_path, "joiner", roles=("echoer",), events=True, **join),
                                     plugins=registry)
        daemons.append(joiner)
        role = joiner.roles[0]

        await asyncio.wait_for(role.drain(), timeout=90)

        assert role.settings.greeting == "bonjour"  # read from the owner-signed manifest
        assert role.heard == {owner.identity.peer_id: "bonjour"}
        assert joiner.events.flush()  # the daemon's events go out through a writer thread
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # the joiner's --events
        assert [e for e in lines if e["event"].startswith("echo.")] == [
            {"event": "echo.heard", "greeting": "bonjour", "peer": owner.identity.peer_id}]
    finally:
        for daemon in reversed(daemons):
            await daemon.aclose()


def test_a_toy_protocols_roles_are_checked_like_any_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gossamer_toy_echo2.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = PLUGINS.extended(importlib.import_module("gossamer_toy_echo2").PLUGIN)

    with pytest.raises(ConfigError, match="role 'learner' belongs to protocol 'diloco', but run e uses protocol 'echo'"):
        registry.check_roles("echo", ["learner"], run="e")
    with pytest.raises(ConfigError, match=r"hyper\.peers must be >= 1, got 0"):
        registry.plugin("echo").read_settings(RunConfig(name="e", protocol="echo", hyper={"peers": 0}))

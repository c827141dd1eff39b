"""A daemon reports how its roles are doing: ``/healthz`` answers 200 with the state while they
run, 503 once one has failed (a task it spawned ended with an exception), and the process
supervisor exits 1 for a failed role, 0 when every role with an end is finished, and serves on
(idle) while a role without an end (the orchestrator) is left. Real daemons, a real DHT, real HTTP;
the protocol is a toy written here."""

from __future__ import annotations

import asyncio
import importlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gossamer.peer.cli.service import supervise
from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.registry import PLUGINS

pytestmark = pytest.mark.timeout(120)

TOY = '''
from dataclasses import dataclass

from gossamer.protocols.core.settings import setting
from gossamer.peer.plugin import ProtocolPlugin
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleHealth


@dataclass(frozen=True, kw_only=True)
class ChoreSettings:
    outcome: str = setting("finish", table="hyper", choices=("finish", "fail"))


class ChoreRole(ProtocolRole[ChoreSettings]):
    name = "chore"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.done = False

    async def start(self):
        self.spawn(self._work(), name="work")

    async def _work(self):
        if self.settings.outcome == "fail":
            raise RuntimeError("the chore broke")
        self.done = True

    def health(self):
        health = super().health()
        return RoleHealth(FINISHED, "chore done") if health.state != FAILED and self.done else health


PLUGIN = ProtocolPlugin(name="chores", summary="toy: one chore per peer", settings=lambda: ChoreSettings,
                        roles=("chore",), load_roles=lambda: {"chore": ChoreRole})
'''


def healthz(daemon: Daemon) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http.address[1]}/healthz", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.parametrize(("outcome", "roles", "http", "state", "code"), [
    ("fail", ("orchestrator", "chore"), 503, "failed", 1),
    ("finish", ("chore",), 200, "finished", 0),
    ("finish", ("orchestrator", "chore"), 200, "idle", None),
])
async def test_healthz_and_the_exit_code_follow_the_roles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          outcome: str, roles: tuple[str, ...], http: int, state: str,
                                                          code: int | None) -> None:
    (tmp_path / f"gossamer_toy_chores_{outcome}.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = PLUGINS.extended(importlib.import_module(f"gossamer_toy_chores_{outcome}").PLUGIN)
    run = RunConfig(name="chores", protocol="chores", heartbeat_s=1.0, hyper={"outcome": outcome})
    config = PeerConfig(identity_path=tmp_path / "owner.pem", host="127.0.0.1", host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                        new_swarm=True, roles=roles)
    daemon = await Daemon.create(config, plugins=registry, run_config=run)
    try:
        chore = next(role for role in daemon.roles if role.name == "chore")
        await asyncio.wait_for(chore.drain(), timeout=60)

        status, body = await asyncio.to_thread(healthz, daemon)
        assert (status, body["state"], body["ok"]) == (http, state, http == 200), body
        if outcome == "fail":
            assert "the chore broke" in body["roles"]["chore"]["detail"]
        stop = asyncio.Event()
        supervising = asyncio.create_task(supervise(daemon, stop))
        if code is None:  # idle: it serves on until stopped
            done, _ = await asyncio.wait({supervising}, timeout=2.5)
            assert not done
            stop.set()
            code = 0
        assert await asyncio.wait_for(supervising, timeout=10) == code
    finally:
        await daemon.aclose()

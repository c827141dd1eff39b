"""When a TL++ run's training is finished the orchestrator's record says so
(``assignment.tlpp_finished``), and the peers whose work ended with it know: the data nodes and the
helper report ``finished`` (``/healthz``) and their process supervisor exits with code 0, while the
orchestrator, which serves the run's manifest and page on, says it is idle. Real daemons (each with
its own DHT node, HTTP and TCP servers) in one process, a secure run (so there is a helper)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.peer.cli.service import supervise
from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.run.manifest import run_config_from_dict
from gossamer.protocols.registry import PLUGINS

pytestmark = pytest.mark.timeout(180)
HYPER = {"mode": "secure", "batch_size": 48, "optimizer": "adam", "lr": 0.01, "steps": 3, "eval_every": 0,
         "min_nodes": 2, "node_timeout_s": 10.0, "helper_timeout_s": 5.0, "helper_wait_s": 2.0}


def config(tmp_path: Path, name: str, **changes: object) -> PeerConfig:
    return PeerConfig(identity_path=tmp_path / f"{name}.pem", host="127.0.0.1", host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                      public_name=name, checkpoint_dir=tmp_path / "checkpoints" / name, **changes)  # type: ignore[arg-type]


def healthz(daemon: Daemon) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.http.address[1]}/healthz", timeout=10) as answer:
        return json.loads(answer.read())


async def test_the_nodes_and_the_helper_exit_when_the_run_is_finished_and_the_orchestrator_says_idle(
        tmp_path: Path) -> None:
    helper, nodes = Identity.create(tmp_path / "helper.pem"), [Identity.create(tmp_path / f"node{i}.pem") for i in (0, 1)]
    run = run_config_from_dict({
        "run": {"name": "finish", "protocol": "tlpp", "heartbeat_s": 1.0},
        "hyper": {**HYPER, "helper": helper.peer_id},
        "admission": {"policy": "allowlist", "allow": [i.public_key.hex() for i in (helper, *nodes)]}})
    owner = await Daemon.create(config(tmp_path, "owner", new_swarm=True, roles=("orchestrator", "tlpp-orchestrator")),
                                run_config=run, plugins=PLUGINS)
    daemons = [owner]
    try:
        join = {"run": owner.manifest.run_id, "initial_peers": tuple(owner.membership.visible_maddrs())}
        daemons.append(await Daemon.create(config(tmp_path, "helper", roles=("helper",), **join), plugins=PLUGINS))
        for i in (0, 1):
            daemons.append(await Daemon.create(
                config(tmp_path, f"node{i}", roles=("node",), data=f"builtin:digits:shard={i}/2", **join),
                plugins=PLUGINS, role_options={"node": {"helper": helper.peer_id}}))
        stop = asyncio.Event()  # never set: each peer below ends by itself

        codes = await asyncio.wait_for(asyncio.gather(*(supervise(d, stop) for d in daemons[1:])), timeout=150)

        assert codes == [0, 0, 0]
        trainer = next(role for role in owner.roles if role.name == "tlpp-orchestrator")
        assert trainer.finished and not trainer.error and trainer.step == HYPER["steps"]  # type: ignore[attr-defined]
        assert trainer.status()["assignment"] == {"tlpp_finished": True}
        for daemon in daemons[1:]:
            body = await asyncio.to_thread(healthz, daemon)
            assert body["state"] == "finished" and body["ok"], body
            assert all(h["detail"] == "the run's training is finished" for h in body["roles"].values()), body
        owner_health = await asyncio.to_thread(healthz, owner)
        assert owner_health["state"] == "idle", owner_health  # it serves the run on until stopped
    finally:
        for daemon in reversed(daemons):
            await daemon.aclose()

"""A role of another protocol is refused through the command line, in one ``error:`` line that
names both protocols, with exit code 2 (regression: ``--roles learner`` in a ``tlpp`` run was
once accepted; ``tests/peer/test_plugin.py`` checks the registry's message itself).

Two ways in: the run owner's ``gossamer orchestrator -c tlpp.toml --roles learner`` (refused before
any I/O), and a volunteer's ``gossamer peer --run <a tlpp run> --roles learner`` (refused once it
has read the run's manifest from the DHT; the run's owner is a real daemon in this process)."""

from __future__ import annotations

import asyncio
import sys
from importlib import resources
from pathlib import Path

import pytest

from gossamer.peer.cli.main import main
from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.run.manifest import load_run_config
from gossamer.protocols.registry import PLUGINS

pytestmark = pytest.mark.timeout(120)

LOOPBACK = ["--host", "127.0.0.1", "--host_maddrs", "/ip4/127.0.0.1/tcp/0"]
REFUSAL = "role 'learner' belongs to protocol 'diloco', but run {run} uses protocol 'tlpp'"


def tlpp_config(tmp_path: Path) -> Path:
    path = tmp_path / "tlpp.toml"
    path.write_text((resources.files("gossamer.peer.cli.presets") / "tlpp.toml").read_text(encoding="utf-8"))
    return path


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_the_owner_of_a_tlpp_run_cannot_take_the_learner_role(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["orchestrator", "-c", str(tlpp_config(tmp_path)), "--roles", "learner",
                 "--identity_path", str(tmp_path / "owner.pem"), *LOOPBACK])

    stderr = capsys.readouterr().err
    assert code == 2
    assert len(error_lines(stderr)) == 1 and "Traceback" not in stderr, stderr
    assert REFUSAL.format(run="tlpp-demo") in error_lines(stderr)[0]
    assert not (tmp_path / "owner.pem").exists(), "refused before anything was written"


async def test_a_peer_joining_a_tlpp_run_as_a_learner_is_refused_in_one_line(tmp_path: Path) -> None:
    run_config = load_run_config(tlpp_config(tmp_path))
    owner = await Daemon.create(PeerConfig(identity_path=tmp_path / "owner.pem", host="127.0.0.1", new_swarm=True,
                                           host_maddrs=("/ip4/127.0.0.1/tcp/0",), roles=("orchestrator",)),
                                plugins=PLUGINS, run_config=run_config)
    try:
        run_id = owner.manifest.run_id
        peer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gossamer.peer.cli", "peer", "--run", run_id, "--roles", "learner",
            "--initial_peers", *owner.membership.visible_maddrs(), "--identity_path", str(tmp_path / "peer.pem"),
            *LOOPBACK, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _out, err = await asyncio.wait_for(peer.communicate(), timeout=90)
    finally:
        await owner.aclose()

    stderr = err.decode()
    assert peer.returncode == 2, stderr
    assert len(error_lines(stderr)) == 1 and "Traceback" not in stderr, stderr
    assert REFUSAL.format(run=run_id) in error_lines(stderr)[0]

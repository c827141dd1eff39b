"""The ``gossamer`` command before any daemon starts: ``--help`` answers without importing torch or
hivemind; each command shows only the flags that apply to it; the swarm lists its presets, takes
its peers' roles from the protocol when the config names none, and refuses a swarm that would do
nothing, in one line; ``gossamer token`` binds every token to a key."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.crypto.tokens import verify_join_token
from gossamer.peer.cli.main import build_parser, main
from gossamer.peer.cli.presets import presets
from gossamer.peer.cli.swarm import Swarm, SwarmOptions
from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import make_run_id
from gossamer.protocols.registry import PLUGINS

HEAVY = ("torch", "hivemind", "aiohttp")


@pytest.mark.parametrize("command", [[], ["peer"], ["orchestrator"], ["swarm"], ["generate"], ["serve"], ["helper"],
                                     ["sample"], ["status"]])
def test_help_imports_neither_torch_nor_hivemind(command: list[str]) -> None:
    probe = ("import sys\nfrom gossamer.peer.cli.main import main\ntry:\n    main([*sys.argv[1:], '--help'])\n"
             f"except SystemExit:\n    pass\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))")
    result = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert "usage: gossamer" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]", "heavy modules imported by --help"


def flags_of(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {flag for action in sub.choices[command]._actions for flag in action.option_strings}  # type: ignore[union-attr]


def test_each_command_shows_only_the_flags_that_apply() -> None:
    assert {"--attack", "--data", "--share_log"} <= flags_of("peer")
    assert "--attack" not in flags_of("orchestrator")
    assert not {"--attack", "--data", "--share_log", "--roles"} & flags_of("serve")
    assert not {"--attack", "--data"} & flags_of("helper") and "--share_log" in flags_of("helper")


def test_swarm_help_lists_the_presets() -> None:
    result = subprocess.run([sys.executable, "-m", "gossamer.peer.cli", "swarm", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert "presets: blocktrain, context, demo, fomoe, quick, tlpp" in result.stdout


@pytest.mark.parametrize("name", presets())
def test_every_preset_is_a_swarm_that_starts(name: str, tmp_path: Path) -> None:
    """What the swarm checks before it starts a process: the settings, the roles, that it trains."""
    swarm = Swarm(SwarmOptions(preset=name, workdir=tmp_path / "w"), PLUGINS)
    assert swarm.num_peers >= 1 and set(swarm.roles) & set(swarm.plugin.swarm_roles)
    assert swarm.plugin.finish is not None and swarm.duration_s, "a preset ends by itself"


README_DILOCO = Path(__file__).parents[3] / "protocols" / "diloco" / "README.md"


def readme_diloco_toml() -> str:
    text = README_DILOCO.read_text()
    block = next(part for part in text.split("```toml")[1:] if 'protocol = "diloco"' in part.split("```")[0])
    return block.split("```")[0]


def test_a_swarm_on_the_readmes_diloco_config_gives_its_peers_the_learner_role(tmp_path: Path) -> None:
    (tmp_path / "tinylm.toml").write_text(readme_diloco_toml())

    swarm = Swarm(SwarmOptions(config=tmp_path / "tinylm.toml", workdir=tmp_path / "w"), PLUGINS)

    assert swarm.roles == ["learner"] and swarm.num_peers == 3


def test_a_swarm_that_would_do_nothing_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "idle.toml").write_text(readme_diloco_toml() + "\n[swarm]\nroles = []\n")
    with pytest.raises(ConfigError, match="none of learner, so nothing would train") as refused:
        Swarm(SwarmOptions(config=tmp_path / "idle.toml", workdir=tmp_path / "w"), PLUGINS)
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="--peers 0: a diloco swarm needs peers with role learner"):
        Swarm(SwarmOptions(config=tmp_path / "idle.toml", peers=0, workdir=tmp_path / "w"), PLUGINS)
    assert not (tmp_path / "w").exists()


def test_a_token_is_always_bound_to_a_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.toml").write_text('[run]\nname = "r"\n[admission]\npolicy = "allowlist"\n')
    owner = tmp_path / "owner.pem"
    Identity.create(owner)
    common = ["token", "-c", str(tmp_path / "run.toml"), "--identity_path", str(owner)]
    with pytest.raises(SystemExit) as unbound:
        main(common)
    assert unbound.value.code == 2 and "--peer_public_key" in capsys.readouterr().err

    assert main([*common, "--peer_public_key", "abc"]) == 2
    assert "must be 64 hex digits" in capsys.readouterr().err

    peer = Identity.generate()
    assert main([*common, "--peer_public_key", peer.public_key.hex()]) == 0
    token = capsys.readouterr().out.strip()
    parsed = verify_join_token(token, owner_public_key=Identity.load(owner).public_key,
                               run_id=make_run_id("r", Identity.load(owner).public_key), now=time.time(),
                               peer_public_key=peer.public_key)
    assert parsed.peer_public_key == peer.public_key

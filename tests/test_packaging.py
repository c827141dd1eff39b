"""What ``pip install`` puts into a user's environment: one top-level package, ``gossamer``.

The fast tests check that pyproject.toml's package list names every package folder and that the
public API map resolves. The end-to-end tests build the wheel once: it holds every listed package
and no harness module; installed into a fresh virtual environment outside the repository, its
console script runs ``--version``, ``swarm --help`` and the one-round ``quick`` preset.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import gossamer

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("peer", "protocols", "transport", "crypto")


def package_folders() -> set[str]:
    found = {"gossamer"}
    for layer in LAYERS:
        for init in (ROOT / layer).rglob("__init__.py"):
            if "_gossamer" not in init.parts:
                found.add(".".join(("gossamer", *init.parent.relative_to(ROOT).parts)))
    return found


def test_the_package_list_names_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert set(config["packages"]) == package_folders()
    assert config["package-dir"] == {"gossamer": "peer/_gossamer", **{f"gossamer.{layer}": layer for layer in LAYERS}}


def test_the_public_api_resolves() -> None:
    for name in gossamer.PUBLIC_API:
        assert getattr(gossamer, name) is not None, name
    assert gossamer.__version__ and set(gossamer.__all__) >= set(gossamer.PUBLIC_API)
    with pytest.raises(AttributeError):
        gossamer.no_such_name  # noqa: B018


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (a build writes build/ and *.egg-info beside them)."""
    source, out = tmp_path_factory.mktemp("source") / "gossamer", tmp_path_factory.mktemp("dist")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                                                "__pycache__", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, text=True, timeout=900)
    (built,) = out.glob("gossamer-*.whl")
    return built


HARNESS_STEMS = {"localnet", "localproc", "faults", "taps", "netns", "wan", "wan_link", "recheck", "report"}
HARNESS_PREFIXES = ("fault_", "faultcase")


def harness_files(names: list[str]) -> list[str]:
    """The entries of a wheel's file list that belong to the dev-only harness."""
    found = []
    for name in names:
        parts = name.split("/")
        stem = parts[-1].removesuffix(".py")
        if (parts[0] == "gossamer_harness" or "testing" in parts[:-1] or stem in HARNESS_STEMS
                or stem.startswith(HARNESS_PREFIXES)):
            found.append(name)
    return found


def test_the_harness_walk_spots_each_kind_of_harness_file() -> None:
    names = ["gossamer_harness/__init__.py", "gossamer/peer/testing/net.py", "gossamer/transport/wan_link.py",
             "gossamer/protocols/diloco/recheck.py", "gossamer/protocols/tlpp/fault_runs.py",
             "gossamer/protocols/tlpp/faultcase.py", "gossamer/peer/daemon.py", "gossamer/peer/kit/ledger.py"]
    assert harness_files(names) == names[:6]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_wheel_holds_every_listed_package_and_no_harness(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert not harness_files(names), harness_files(names)
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    missing = [package for package in listed if f"{package.replace('.', '/')}/__init__.py" not in names]
    assert not missing, f"packages of pyproject.toml missing from the wheel: {missing}"


@pytest.mark.e2e
@pytest.mark.timeout(2400)
def test_the_wheel_installs_one_top_level_package_that_runs_from_a_clean_venv(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"gossamer"}, top
    assert "gossamer/peer/cli/presets/quick.toml" in names and "gossamer/__init__.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    python, script = venv / "bin" / "python", venv / "bin" / "gossamer"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=900)
    # the dependencies (torch, hivemind, ...) come from this environment's site-packages, appended
    # after the clean venv's own: gossamer itself can only be found in the wheel's copy
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    dependencies = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site) / "gossamer-test-deps.pth").write_text("\n".join(dependencies) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def run(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=outside, env=env, capture_output=True, text=True, timeout=timeout_s)

    where = run(str(python), "-c", "import gossamer, gossamer.peer.cli.main; print(gossamer.__file__)")
    assert where.returncode == 0 and where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    version = run(str(script), "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"gossamer {gossamer.__version__}"
    helped = run(str(script), "swarm", "--help")
    assert helped.returncode == 0 and "--preset" in helped.stdout, helped.stderr
    swarm = run(str(script), "swarm", "--preset", "quick", "--workdir", str(tmp_path / "swarm"), timeout_s=1200)
    assert swarm.returncode == 0, swarm.stdout[-3000:] + swarm.stderr[-3000:]
    assert "the run is finished (all 2 peers)" in swarm.stdout and "stopped 3 process(es) cleanly" in swarm.stdout

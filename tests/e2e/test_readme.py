"""Every ``gossamer`` command line of README.md and the protocol READMEs, run as written: each
``## `` section with commands (found in whichever README holds it) has one walk here, which writes
its TOML blocks and fills the placeholders (RUN, MADDR, PUBLIC_IP, K, CHECKPOINT) from the live run,
each volunteer with its own home folder; ``test_every_readme_command_is_walked`` fails on a section
or command no walk runs (``STORIES`` repeat a walked section's lines; ``ELSEWHERE`` run elsewhere)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gossamer.crypto.identity import Identity
from tests.protocols.tlpp.harness import digits_28

# Every limit below is a last resort for a broken run, sized for a CI host at load 40 on 2 cores
# (commands that take seconds at load 2 took over 120 s there); waits end on the line they expect
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]
ROOT = Path(__file__).parents[2]
BIN = Path(sys.executable).parent
WALKED = {"Identity", "Host a run (orchestrator)", "Join a run (volunteer)", "Train a model together (gossip DiLoCo)",
          "Split learning on private data (TL++)", "TL++ on your own data: declare a model, bring an .npz",
          "BlockTrain: train blocks apart, serve them across hosts",
          "Long sequences over slow links (compressed context parallelism)",
          "Partial-expert replicas of an MoE LM (FoMoE)", "A local swarm"}
# README.md's user stories whose commands are lines of a protocol README's section, walked there
STORIES = {"Host the TL++ helper (a second operator)": "Split learning on private data (TL++)",
           "Serve a trained model, query it over TCP": "BlockTrain: train blocks apart, serve them across hosts"}
ELSEWHERE = {"gossamer swarm --preset demo": "tests/e2e/test_swarm.py",
             "gossamer swarm --preset context": "tests/e2e/test_context.py",
             "gossamer swarm --preset fomoe": "scripts/chaos/fomoe_hosts.py",
             # minutes of training: its checks run in tests/peer/cli (it starts) and
             # tests/protocols/blocktrain/test_coordinator.py (the closing sample); its README quotes a run
             "gossamer swarm --preset blocktrain": "tests/peer/cli/test_cli.py"}


def readmes() -> list[Path]:
    """README.md and every protocol's README, the files whose commands are walked."""
    return [ROOT / "README.md", *sorted(ROOT.glob("protocols/*/README.md"))]


def sections_in(readme: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Per ``## `` section of one README: its gossamer command lines, and its TOML files by name."""
    out: dict[str, tuple[list[str], dict[str, str]]] = {}
    for part in readme.read_text().split("\n## ")[1:]:
        title, _, body = part.partition("\n")
        commands, files = [], {}
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", body, flags=re.S):
            if lang == "toml":
                name = re.match(r"# (\S+\.toml)\n", block)
                if name:
                    files[name.group(1)] = block
                continue
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line.startswith("gossamer "):
                    commands.append(" ".join(line.split()))
        if commands:
            out[title.strip()] = (commands, files)
    return out


def homes() -> dict[str, list[Path]]:
    """Each section with commands, and the READMEs that hold it (one, unless a heading is repeated)."""
    found: dict[str, list[Path]] = {}
    for readme in readmes():
        for title in sections_in(readme):
            found.setdefault(title, []).append(readme)
    return found


def sections() -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every section with commands, from whichever README holds it."""
    out: dict[str, tuple[list[str], dict[str, str]]] = {}
    for readme in readmes():
        for title, found in sections_in(readme).items():
            out.setdefault(title, found)
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Walk:
    """The processes of one README walk, in ``work``; ``owner`` is the run owner's home."""

    def __init__(self, work: Path, files: dict[str, str]) -> None:
        self.work = work
        for name, text in files.items():
            (work / name).write_text(text)
        self.fill: dict[str, str] = {"PUBLIC_IP": "127.0.0.1"}
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.homes = 0

    def home(self, owner: bool) -> Path:
        if owner:
            path = self.work / "owner-home"
        else:
            self.homes += 1
            path = self.work / f"home-{self.homes}"
        path.mkdir(exist_ok=True)
        return path

    def argv(self, line: str, **extra: str) -> list[str]:
        values = {**self.fill, **extra}
        words = []
        for word in shlex.split(line):
            if word in values:
                words.extend(values[word].split())
            else:
                for key in ("K", "PUBLIC_IP"):
                    if key in values:
                        word = re.sub(rf"\b{key}\b", values[key], word)
                words.append(word)
        assert words[0] == "gossamer"
        return [str(BIN / "gossamer"), *words[1:]]

    def env(self, home: Path) -> dict[str, str]:
        return {**os.environ, "HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}

    def start(self, line: str, *, owner: bool = False, home: Path | None = None, **extra: str) -> tuple[subprocess.Popen, Path]:
        home = home or self.home(owner)
        log = self.work / f"proc-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(self.argv(line, **extra), cwd=self.work, env=self.env(home), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((proc, log))
        return proc, log

    def run(self, line: str, *, owner: bool = False, home: Path | None = None, timeout_s: float = 600,
            **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(line, **extra), cwd=self.work, env=self.env(home or self.home(owner)),
                              capture_output=True, text=True, timeout=timeout_s)

    def fill_file(self, name: str, values: dict[str, str]) -> None:
        """Replace placeholders in a file the README's TOML block wrote (longest first)."""
        text = (self.work / name).read_text()
        for key in sorted(values, key=len, reverse=True):
            text = text.replace(key, values[key])
        (self.work / name).write_text(text)

    def wait_for(self, log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float = 900) -> re.Match:
        """The first match of ``pattern`` in what the process printed (it prints as it goes)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, log.read_text(errors="replace"))
            if found:
                return found
            if proc.poll() is not None:
                found = re.search(pattern, log.read_text(errors="replace"))
                assert found, f"exited ({proc.returncode}) before printing {pattern!r}:\n{log.read_text()[-3000:]}"
                return found
            time.sleep(0.2)  # polls the process's output for a line it prints; not a synchronisation guess
        raise AssertionError(f"no {pattern!r} within {timeout_s}s:\n{log.read_text(errors='replace')[-3000:]}")

    def owner_started(self, line: str) -> tuple[subprocess.Popen, Path]:
        proc, log = self.start(line, owner=True)
        up = self.wait_for(log, r"is up in run (\S+)\n  http (\S+) .*\n.*\n    --run \S+ --initial_peers (.+)\n", proc,
                           timeout_s=600)
        self.fill.update(RUN=up.group(1), MADDR=up.group(3).strip())
        self.http = up.group(2)
        return proc, log

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = 180) -> int:
        if proc.poll() is None:
            proc.send_signal(sig)
        return self._wait(proc, timeout_s)

    def stop_all(self, procs: list[subprocess.Popen], timeout_s: float = 180) -> list[int]:
        """One Ctrl+C to every process at once (they shut down side by side), then their exit codes
        (a second Ctrl+C would force the exit, or land after the daemon's handler is gone)."""
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        return [self._wait(proc, timeout_s) for proc in procs]

    @staticmethod
    def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def close(self) -> None:
        for proc, _log in reversed(self.procs):
            self.stop(proc, signal.SIGTERM)


@pytest.fixture
def walk_of(tmp_path: Path):
    walks = []

    def make(section: str) -> tuple[Walk, list[str]]:
        commands, files = sections()[section]
        walks.append(Walk(tmp_path, files))
        return walks[-1], commands

    yield make
    for walk in walks:
        walk.close()


def test_every_readme_command_is_walked() -> None:
    where = homes()
    repeated = {title: [str(path.relative_to(ROOT)) for path in paths] for title, paths in where.items() if len(paths) > 1}
    assert not repeated, f"a section heading in two READMEs (which one is walked?): {repeated}"
    found = sections()
    assert set(found) == WALKED | set(STORIES), \
        f"README sections with commands that no walk runs: {set(found) ^ (WALKED | set(STORIES))}"
    for story, section in STORIES.items():
        unwalked = [line for line in found[story][0] if line not in found[section][0]]
        assert not unwalked, f"{story!r} shows commands that {section!r} does not: {unwalked}"


def test_identity(walk_of) -> None:
    walk, commands = walk_of("Identity")
    assert commands == ["gossamer identity new", "gossamer identity show"]
    made = walk.run(commands[0], owner=True)
    shown = walk.run(commands[1], owner=True)
    assert made.returncode == 0 and shown.returncode == 0, made.stderr + shown.stderr
    assert made.stdout == shown.stdout and "peer id:" in shown.stdout
    assert (walk.home(True) / ".gossamer" / "identity.pem").stat().st_mode & 0o777 == 0o600


def test_host_a_run_and_join_it(walk_of) -> None:
    walk, host = walk_of("Host a run (orchestrator)")
    join, _files = sections()["Join a run (volunteer)"]
    orchestrator, token = host
    for port in ("31337", "8080", "8081"):
        walk.fill[port] = str(free_port())
    orchestrator = " ".join(walk.fill.get(word, word) if word.isdigit() else
                            re.sub(r"tcp/31337", f"tcp/{walk.fill['31337']}", word) for word in orchestrator.split())
    owner, _ = walk.owner_started(orchestrator)
    assert walk.http.endswith(f":{walk.fill['8080']}")
    issued = walk.run(token, owner=True, PUBLIC_KEY=Identity.generate().public_key.hex())
    assert issued.returncode == 0 and len(issued.stdout.strip()) > 40, issued.stderr

    volunteer, log = walk.start(join[0])
    walk.wait_for(log, r"is up in run", volunteer, timeout_s=600)
    status = walk.run(join[1])
    assert status.returncode == 0, status.stderr
    assert "my-gpu-box" in status.stdout and "owner" in status.stdout, status.stdout
    assert walk.stop(volunteer) == 0 and owner.poll() is None


def test_train_a_model_together_stop_sample_and_resume(walk_of) -> None:
    walk, (orchestrator, learner, sample) = walk_of("Train a model together (gossip DiLoCo)")
    walk.owner_started(orchestrator)
    home = walk.home(False)
    proc, log = walk.start(learner, home=home)
    walk.wait_for(log, r"round 1: train loss", proc)
    assert walk.stop(proc) == 0
    checkpoint = walk.wait_for(log, r"learner: checkpoint written to (\S+)", proc).group(1)

    sampled = walk.run(sample, CHECKPOINT=checkpoint)
    assert sampled.returncode == 0 and sampled.stdout.startswith("The ") and len(sampled.stdout) > 100, sampled.stderr

    again, log = walk.start(learner, home=home)
    resumed = int(walk.wait_for(log, r"resumed from \S+ at round (\d+)", again).group(1))
    assert resumed >= 2
    walk.wait_for(log, rf"round {resumed}: train loss", again)
    assert walk.stop(again) == 0


def test_tlpp_split_learning(walk_of) -> None:
    """Secure mode: the helper's operator and each data owner make an identity, the run owner pins
    the helper and admits their keys (HELPER, HELPER_KEY, OWNER_KEY_K in digits.toml), each data
    owner pins the helper with --helper HELPER."""
    walk, (identity, orchestrator, helper, node) = walk_of("Split learning on private data (TL++)")
    homes = {who: walk.home(False) for who in ["HELPER", *(f"OWNER_{k}" for k in range(3))]}
    values = {}
    for who, home in homes.items():
        made = walk.run(identity, home=home)
        assert made.returncode == 0, made.stderr
        peer_id, key = re.search(r"peer id:\s+(\S+)\npublic key:\s+(\S+)", made.stdout).groups()  # type: ignore[union-attr]
        values[f"{who.replace('OWNER_', 'OWNER_KEY_') if who != 'HELPER' else 'HELPER_KEY'}"] = key
        if who == "HELPER":
            values["HELPER"] = peer_id
    walk.fill_file("digits.toml", values)
    walk.fill["HELPER"] = values["HELPER"]
    owner, owner_log = walk.owner_started(orchestrator)
    walk.start(helper, home=homes["HELPER"])
    for k in range(3):
        walk.start(node, home=homes[f"OWNER_{k}"], K=str(k))
    walk.wait_for(owner_log, r"\] +25/500  held-out at step 25: loss [\d.]+, accuracy", owner, timeout_s=900)


def test_tlpp_declared_model_on_npz_files(walk_of) -> None:
    """The data owners' .npz files, written as the README's snippet writes them, from sklearn's
    digits upsampled to 28x28 (raw 0..16 pixels: the run normalises them); the run owner's held-out
    split likewise."""
    walk, (orchestrator, node) = walk_of("TL++ on your own data: declare a model, bring an .npz")
    for k, path in enumerate(digits_28(walk.work, owners=3)):
        data = np.load(path)
        name = "heldout.npz" if k == 2 else f"clinic-{k}.npz"
        np.savez(walk.work / name, x=data["x"].astype(np.float32), y=data["y"].astype(np.int64))
    owner, owner_log = walk.owner_started(orchestrator)
    for k in range(2):
        walk.start(node, K=str(k))
    walk.wait_for(owner_log, r"input normalisation from 2 node\(s\), \d+ samples", owner, timeout_s=900)
    first = walk.wait_for(owner_log, r"\] +25/300  held-out at step 25: loss [\d.]+, accuracy ([\d.]+)", owner,
                          timeout_s=900)
    assert float(first.group(1)) > 0.3, first.group(0)  # ten classes: chance is 0.1


def test_blocktrain_train_serve_generate(walk_of) -> None:
    walk, commands = walk_of("BlockTrain: train blocks apart, serve them across hosts")
    orchestrator, worker, serve_low, serve_high, generate, preset = commands
    assert preset in ELSEWHERE
    owner, owner_log = walk.owner_started(orchestrator)
    proc, _log = walk.start(worker)
    walk.wait_for(owner_log, r"the run is finished .*still serving as orchestrator", owner, timeout_s=900)
    # the final stack's continuation, as repr() quotes it (double quotes when the text holds a ')
    walk.wait_for(owner_log, r"\n  sample \(prompt 'The '\): ['\"]", owner)
    assert proc.wait(timeout=600) == 0, "a worker exits by itself once the run is finished"
    for line in (serve_low, serve_high):
        server, server_log = walk.start(line)
        walk.wait_for(server_log, r"is up in run", server, timeout_s=600)
    generated = walk.run(generate, timeout_s=600)
    assert generated.returncode == 0 and generated.stdout.startswith("The "), generated.stderr[-2000:]
    assert len(generated.stdout.encode()) >= len("The ") + 64


def test_fomoe_expert_hosts_and_their_coverage(walk_of) -> None:
    walk, commands = walk_of("Partial-expert replicas of an MoE LM (FoMoE)")
    orchestrator, host, status = [line for line in commands if line not in ELSEWHERE]
    walk.owner_started(orchestrator)
    hosts = [walk.start(host) for _ in range(4)]  # min_hosts = 4
    for proc, log in hosts:  # a round of all four (a host cut off by a fault rejoins within a few rounds)
        walk.wait_for(log, r"round \d+: train loss [\d.]+  held-out [\d.]+  experts \[\d+, \d+, \d+, \d+\]  "
                      r"skipped [\d.]+  updates used 3 of 3", proc, timeout_s=900)
    shown = walk.run(status)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"experts: 8 expert\(s\), r = 2, [34] member\(s\)", shown.stdout), shown.stdout
    rows = re.findall(r"^(\d)\s+([0-9a-f]{12}),([0-9a-f]{12})\s+(\d+)\s*$", shown.stdout, flags=re.M)
    assert [int(row[0]) for row in rows] == list(range(8)) and all(int(row[3]) > 0 for row in rows), shown.stdout
    assert walk.stop_all([proc for proc, _log in hosts]) == [0, 0, 0, 0]


def test_context_parallel_ring_status_stop_and_resume(walk_of) -> None:
    walk, commands = walk_of("Long sequences over slow links (compressed context parallelism)")
    orchestrator, shard, status, preset = commands
    assert preset in ELSEWHERE
    walk.owner_started(orchestrator)
    homes = [walk.home(False) for _ in range(3)]
    procs = [walk.start(shard, home=home) for home in homes]
    first, first_log = procs[0]
    walk.wait_for(first_log, r"step \d+: loss [\d.]+  chunk \d of 3 \(192-token context\)", first, timeout_s=900)
    shown = walk.run(status)
    assert shown.returncode == 0 and "ring of 3 chunk(s), 192-token context" in shown.stdout, shown.stdout + shown.stderr

    second, second_log = procs[1]
    assert walk.stop(second) == 0
    walk.wait_for(second_log, r"cp-shard: checkpoint written to \S+-state\.safetensors", second)
    again, again_log = walk.start(shard, home=homes[1])
    resumed = int(walk.wait_for(again_log, r"resumed from \S+ at step (\d+)", again).group(1))
    assert resumed >= 1
    walk.wait_for(again_log, r"step \d+: loss [\d.]+  chunk \d of 3", again)


def test_a_local_swarm(walk_of, tmp_path: Path) -> None:
    walk, commands = walk_of("A local swarm")
    walk.work.joinpath("run.toml").write_text(sections()["Host a run (orchestrator)"][1]["run.toml"])
    for line in commands:
        if line in ELSEWHERE:
            continue
        proc, log = walk.start(line)
        if "--preset quick" in line:
            assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
            assert "the run is finished (all 2 peers)" in log.read_text()
        else:
            walk.wait_for(log, r"all 5 peers see each other", proc)
            assert walk.stop(proc) == 0 and "stopped 5 process(es) cleanly" in log.read_text()
    assert {line for line in commands if line not in ELSEWHERE} == {"gossamer swarm --preset quick",
                                                                     "gossamer swarm -c run.toml --peers 4"}

"""Shared parts of the chaos scripts: which code runs the daemons, RSS sampling, an honest prober,
and the report.

Each script runs its attacks against real daemons started through the CLI, twice side by side:
once on this checkout ("fixed") and once on a git ref from before the fix ("before", built from
``git archive`` into a scratch folder and put first on ``PYTHONPATH`` through a small
``gossamer`` shim package), so every table compares the two on the same machine within minutes.
Attackers connect from their own loopback address (``ATTACKER``, and more for the many-address
rows); the daemons' own traffic and the honest prober come from 127.0.0.1, as peers on other
hosts would.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossamer.peer.testing.localproc import LOOPBACK, GossamerProcess, rss_bytes

ATTACKER = "127.0.0.66"
RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[2]
MB = 1_000_000


@dataclass(frozen=True)
class Code:
    """The gossamer a daemon runs: this checkout (env None) or a baseline on PYTHONPATH."""

    label: str
    env: dict[str, str] | None = None


def baseline_code(ref: str, scratch: Path) -> Code:
    """The code at git ``ref``, unpacked under ``scratch`` and importable as ``gossamer``."""
    source = scratch / f"baseline-{ref}"
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    shim = source / "_shim" / "gossamer"
    shim.mkdir(parents=True)
    shutil.copy(source / "peer" / "_gossamer" / "__init__.py", shim / "__init__.py")
    for layer in ("peer", "protocols", "transport", "crypto"):
        (shim / layer).symlink_to(source / layer)
    env = {**os.environ, "PYTHONPATH": str(source / "_shim")}
    where = subprocess.run([sys.executable, "-c", "import gossamer.transport.http_server as m; print(m.__file__)"],
                           check=True, capture_output=True, text=True, env=env).stdout.strip()
    if not where.startswith(str(source)):
        raise RuntimeError(f"the baseline shim does not take precedence: gossamer imports from {where}")
    return Code(label=f"before ({ref})", env=env)


class Daemons:
    """The processes of one run (an orchestrator and peers), all on ``code``."""

    def __init__(self, code: Code, work: Path, run_toml: str) -> None:
        self.code, self.work = code, work
        work.mkdir(parents=True, exist_ok=True)
        (work / "run.toml").write_text(run_toml)
        self.procs: dict[str, GossamerProcess] = {}
        self.orch = self._start("orchestrator", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm"])
        self.ready = self.orch.wait_ready(timeout_s=120)

    def _start(self, name: str, args: list[str]) -> GossamerProcess:
        proc = GossamerProcess([*args, "--events", *LOOPBACK, "--threads", "1", "--identity_path",
                                str(self.work / f"{name}.pem"), "--checkpoint_dir", str(self.work / "ckpt")],
                               log_path=self.work / f"{name}.log", env=self.code.env)
        self.procs[name] = proc
        return proc

    def add(self, name: str, args: list[str]) -> GossamerProcess:
        """A peer of the run: ``args`` after the subcommand name (e.g. ["peer", "--roles", "learner"])."""
        return self._start(name, [args[0], "--run", self.ready["run_id"], "--initial_peers", *self.ready["maddrs"],
                                  *args[1:]])

    def stop(self) -> None:
        for proc in [*self.procs.values()]:
            proc.stop()


class RssSampler:
    """Samples a process's resident set size every ``interval_s`` (a task of the running loop)."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), rss_bytes(self.pid)))
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def between(self, start: float, end: float) -> list[int]:
        return [rss for t, rss in self.samples if start <= t <= end]


@dataclass
class Probes:
    """Honest requests made during a window: (time, outcome, latency_s) each."""

    results: list[tuple[float, str, float]] = field(default_factory=list)

    def summary(self, start: float, end: float) -> dict[str, Any]:
        window = [(outcome, latency) for t, outcome, latency in self.results if start <= t <= end]
        served = [latency for outcome, latency in window if outcome == "served"]
        failures: dict[str, int] = {}
        for outcome, _ in window:
            if outcome != "served":
                failures[outcome] = failures.get(outcome, 0) + 1
        quantiles = statistics.quantiles(served, n=20) if len(served) >= 2 else [float("nan")] * 19
        return {"probes": len(window), "served": len(served),
                "served_pct": round(100.0 * len(served) / len(window), 1) if window else None,
                "p50_ms": round(1000 * statistics.median(served), 1) if served else None,
                "p95_ms": round(1000 * quantiles[18], 1) if served else None, "failures": failures}


async def probe_loop(probe: Callable[[], Awaitable[str]], probes: Probes, stop: asyncio.Event,
                     interval_s: float) -> None:
    """Run ``probe`` every ``interval_s`` until ``stop``; it returns "served" or what went wrong."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            outcome = await asyncio.wait_for(probe(), timeout=10.0)
        except TimeoutError:
            outcome = "timeout"
        except OSError as exc:
            outcome = f"error: {type(exc).__name__}"
        probes.results.append((started, outcome, time.monotonic() - started))
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval_s - (time.monotonic() - started)))
        except TimeoutError:
            pass


async def open_from(host: str, port: int, source: str | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(host, port, local_addr=(source, 0) if source else None)


def mb(values: list[int], pick: Callable[[list[int]], float]) -> float | None:
    return round(pick(values) / MB, 1) if values else None


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def write_report(name: str, rows: list[dict[str, Any]], columns: list[tuple[str, str]], meta: dict[str, Any]) -> None:
    """Print a markdown table of ``rows`` and write them (and ``meta``) to results/<name>.json."""
    print(f"\n{name}: load average (1/5/15 min) at the end {load_average()}; {meta.get('note', '')}")
    print("| " + " | ".join(title for _, title in columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(_cell(row.get(key)) for key, _ in columns) + " |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"meta": {**meta, "load_average": load_average()}, "rows": rows}, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    return str(value)

"""Shared parts of the attack scripts (``http_slots.py``, ``tcp_slots.py``): real daemons run on this
checkout and on a git ref from before a fix (``baseline_code``: ``git archive`` behind a small
``gossamer`` shim on ``PYTHONPATH``), RSS sampling, an honest prober from 127.0.0.1 while attackers
connect from their own loopback addresses (``ATTACKER``), and the report."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossamer_harness.localproc import LOOPBACK, GossamerProcess, rss_bytes
from gossamer_harness.report import load_average_text, machine, markdown_table, write_json

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


async def drip_connection(host: str, port: int, source: str, first: bytes, drip: bytes, drip_s: float | None,
                          stop: asyncio.Event) -> bytes | None:
    """Connect from ``source``, send ``first``, then one byte of ``drip`` (cycled) every ``drip_s``
    (nothing if None) until ``stop`` or the server answers or closes. The server's first bytes
    (b"" if it closed without a word), or None if the connection was held to the end; OSError if
    it cannot connect."""
    reader, writer = await open_from(host, port, source)
    answer, stopped = asyncio.create_task(reader.read(4096)), asyncio.create_task(stop.wait())
    sent = 0
    try:
        writer.write(first)
        while not stop.is_set() and not answer.done():
            await asyncio.wait([answer, stopped], timeout=drip_s, return_when=asyncio.FIRST_COMPLETED)
            if drip_s is not None and drip and not answer.done() and not stop.is_set():
                writer.write(drip[sent % len(drip):sent % len(drip) + 1])
                sent += 1
        return answer.result() if answer.done() else None
    except OSError as exc:
        return type(exc).__name__.encode()
    finally:
        answer.cancel()
        stopped.cancel()
        writer.close()


async def keep_dripping(host: str, port: int, source: str, first: bytes, drip: bytes, drip_s: float | None,
                        stop: asyncio.Event, classify: Callable[[bytes | None], str]) -> dict[str, int]:
    """``drip_connection`` again and again until ``stop``, reconnecting when cut or refused (as a
    real attacker would); how the connections ended, counted by ``classify``."""
    outcomes: dict[str, int] = {}
    while not stop.is_set():
        try:
            outcome = classify(await drip_connection(host, port, source, first, drip, drip_s, stop))
        except OSError as exc:
            outcome = f"connect failed: {type(exc).__name__}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if not stop.is_set():
            await asyncio.sleep(0.2)  # the attacker's pace between attempts
    return outcomes


async def many(count: int, sources: list[str], attacker: Callable[[str, asyncio.Event], Awaitable[dict[str, int]]],
               duration_s: float) -> dict[str, Any]:
    """``count`` attackers spread over ``sources`` for ``duration_s``; their outcomes summed."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(attacker(sources[i % len(sources)], stop)) for i in range(count)]
    await asyncio.sleep(duration_s)
    stop.set()
    totals: dict[str, int] = {}
    for outcomes in await asyncio.gather(*tasks):
        for kind, number in outcomes.items():
            totals[kind] = totals.get(kind, 0) + number
    return {"connections": totals}


async def measure(name: str, attack: Callable[[], Awaitable[dict[str, Any]]], code: Code, rss: RssSampler,
                  probes: Probes, *, calm_s: float, cool_s: float, min_window_s: float = 5.0
                  ) -> tuple[dict[str, Any], tuple[float, float, float]]:
    """A calm window, the attack, a cool-down: the row every scenario reports (RSS before, at the
    peak, after; the honest probes during the attack, over at least ``min_window_s``), and the
    (calm start, attack start, window end) times."""
    before = time.monotonic()
    await asyncio.sleep(calm_s)
    start = time.monotonic()
    detail = await attack()
    end = time.monotonic()
    window_end = max(end, start + min_window_s)
    await asyncio.sleep(max(cool_s, window_end - time.monotonic()))
    now = time.monotonic()
    row = {"code": code.label, "scenario": name, "rss_before_mb": mb(rss.between(before, start), statistics.median),
           "rss_peak_mb": mb(rss.between(start, end + 1.0), max),
           "rss_after_mb": mb(rss.between(now - 1.0, now), statistics.median), "attack_s": round(end - start, 1),
           **{f"honest_{k}": v for k, v in probes.summary(start, window_end).items()}, "attack": detail}
    return row, (before, start, window_end)


async def compare(baseline_ref: str, prefix: str,
                  run_code: Callable[[Code, Path], Awaitable[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """``run_code`` on the baseline (if a ref is given), then on this checkout; all their rows."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        codes = [Code(label="fixed (this checkout)")]
        if baseline_ref:
            codes.insert(0, baseline_code(baseline_ref, Path(scratch)))
        for index, code in enumerate(codes):
            rows += await run_code(code, Path(scratch) / f"run{index}")
    return rows


def mb(values: list[int], pick: Callable[[list[int]], float]) -> float | None:
    return round(pick(values) / MB, 1) if values else None


def write_report(name: str, rows: list[dict[str, Any]], columns: list[tuple[str, str]], meta: dict[str, Any]) -> None:
    """Print a markdown table of ``rows`` and write them (and ``meta``) to results/<name>.json."""
    print(f"\n{name}: load average (1/5/15 min) at the end {load_average_text()}; {meta.get('note', '')}")
    print(markdown_table([title for _, title in columns], [[_cell(row.get(key)) for key, _ in columns] for row in rows]))
    path = write_json(RESULTS / f"{name}.json", {"meta": {**meta, "load_average": load_average_text()},
                                                 "machine": machine(), "rows": rows})
    print(f"wrote {path.relative_to(REPO)}")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    return str(value)

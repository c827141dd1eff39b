"""Shared parts of the soaks (``soak.py``, ``soak_tlpp.py``, ``soak_blocktrain.py``): sampling every
process's ``/status``, the line fitted over the second half of the run, the pass rule "flat"
(``FLAT_PER_100``: growth per 100 rounds, steps or versions; a count that only moves with the
requests in flight is no leak) and the report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gossamer_harness.report import load_average_text, machine, write_json

SERIES = ("rss_bytes", "asyncio_tasks", "open_fds", "threads")
STATUS_TIMEOUT_S = 30.0
FLAT_PER_100 = {"rss_bytes": 5e6, "asyncio_tasks": 1.0, "open_fds": 1.0, "threads": 1.0}


def status(http: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/status", timeout=STATUS_TIMEOUT_S) as reply:
        return json.loads(reply.read())


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


class Sampler:
    """The series of every process, by name, against the run's progress (a round, step, version)."""

    def __init__(self, https: dict[str, str], pids: dict[str, int] | None = None) -> None:
        """``pids``: a process whose ``/status`` times out gets SIGUSR1 (the daemon writes every
        thread's stack to its log: where it was stuck)."""
        self.https = https
        self.pids = pids or {}
        self.samples: dict[str, dict[str, list[tuple[float, float]]]] = {s: {n: [] for n in https} for s in SERIES}
        self.timeouts: list[tuple[float, str]] = []  # (progress, process) whose /status did not answer in time

    def sample(self, x: float, skip: set[str], finished: Callable[[str], bool]) -> dict[str, dict[str, Any]]:
        """Read every process's ``/status`` but those in ``skip``; their status documents, by name.
        A process that refuses is added to ``skip`` when ``finished(name)`` says it finished its run
        (it is closing); otherwise the refusal is raised."""
        seen = {}
        for name, http in self.https.items():
            if name in skip:
                continue
            try:
                seen[name] = status(http)
            except TimeoutError:  # its event loop did not answer in STATUS_TIMEOUT_S: counted, reported
                self._timed_out(x, name)
                continue
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, TimeoutError):
                    self._timed_out(x, name)
                    continue
                if not finished(name):
                    raise
                skip.add(name)
                continue
            for series in SERIES:
                self.samples[series][name].append((float(x), float(seen[name]["process"][series])))
        return seen

    def _timed_out(self, x: float, name: str) -> None:
        self.timeouts.append((float(x), name))
        if name in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pids[name], signal.SIGUSR1)

    def slopes(self, half: float) -> dict[str, dict[str, float]]:
        """Slope per 100 units over x >= ``half``, per series and process."""
        return {series: {name: 100 * slope([p for p in points if p[0] >= half])
                         for name, points in by_name.items() if len([p for p in points if p[0] >= half]) >= 2}
                for series, by_name in self.samples.items()}


def report(title: str, sampler: Sampler, *, half: float, unit: str, extra: dict[str, Any], lines: list[str],
           problems: list[Any], codes: list[int], json_path: Path, load_before: str, work: Path) -> bool:
    """Print the table and ``lines``, write the JSON; whether the soak passed."""
    slopes = sampler.slopes(half)
    worst = {s: max(slopes[s].values()) if slopes[s] else 0.0 for s in SERIES}  # the most growth: a fall is no leak
    flat = {s: worst[s] < FLAT_PER_100[s] for s in SERIES}
    first = next(iter(sampler.https))
    print(f"\n{title}; load before {load_before}, after {load_average_text()}\n")
    print(f"| series | first value ({first}) | last value ({first}) | largest slope per 100 {unit}s, 2nd half "
          "(all processes) | flat |")
    print("|---|---|---|---|---|")
    for s in SERIES:
        points = sampler.samples[s][first]
        scale, suffix = (1e6, "MB") if s == "rss_bytes" else (1.0, "")
        print(f"| {s} | {points[0][1] / scale:.1f}{suffix} | {points[-1][1] / scale:.1f}{suffix} "
              f"| {worst[s] / scale:+.2f}{suffix} | {'yes' if flat[s] else 'NO'} |")
    for line in lines:
        print(line)
    print(f"ledgers with balance problems: {len(problems)}; /status reads that timed out ({STATUS_TIMEOUT_S:.0f} s): "
          f"{len(sampler.timeouts)} {sampler.timeouts[:5]}; exit codes {codes}; logs in {work}")
    write_json(json_path, {**extra, "title": title, "unit": unit, "slopes_per_100": slopes, "flat": flat,
                           "balance_problems": problems, "exit_codes": codes, "status_timeouts": sampler.timeouts,
                           "samples": sampler.samples, "load_before": load_before,
                           "load_after": load_average_text(), "machine": machine()}, indent=None)
    return all(flat.values()) and not problems and not any(codes) and not sampler.timeouts


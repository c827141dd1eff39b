"""Worker processes of a benchmark driven in lock step over pipes (``Scenario``, ``ScenarioRun``,
``run_interleaved``: rows interleaved under like load), and the transfer statistics."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import statistics
import traceback
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from gossamer_harness.report import MB

Worker = Callable[[Connection, dict[str, Any]], None]


class BenchError(RuntimeError):
    """A benchmark worker failed, hung, or returned wrong data."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Worker processes of one benchmark row and how to drive them.

    Attributes:
        name: the row's key in the JSON output.
        workers: (worker function, parameters) per process, started in this order.
        repeats: timed repetitions, after one untimed warm-up repetition (index 0).
        step_timeout_s: most time the coordinator waits for any one answer of a worker.
    """

    name: str
    workers: list[tuple[Worker, dict[str, Any]]]
    repeats: int
    step_timeout_s: float = 300.0


def _worker_main(target: Worker, conn: Connection, params: dict[str, Any]) -> None:
    """Process entry point: pin to ``params["pin_cpu"]`` if set, run the worker; on failure send
    the traceback and exit non-zero. Processes the worker forks (hivemind's) inherit the pinning.

    SIGTERM (``ScenarioRun.end`` after a failure elsewhere) raises SystemExit, so that the
    worker's ``finally`` blocks shut down what it started (hivemind's DHT and p2pd processes).
    """
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if params.get("pin_cpu") is not None:
            os.sched_setaffinity(0, {params["pin_cpu"]})
        target(conn, params)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(1)


class ScenarioRun:
    """The started processes of one scenario, driven one step at a time over pipes, never with sleeps:

    1. worker *i* is started (the "spawn" context) with its parameters plus the ``ready`` infos of
       the workers before it (e.g. the receiver's address), and sends ``("ready", info)`` once set up;
    2. for each repetition every worker gets ``("go", index)`` and answers ``("rep", result)``: a
       sender times one transfer, a receiver reports what it received;
    3. ``("stop", None)`` makes every worker tear down and answer ``("done", extra)``.

    A worker that fails sends ``("error", traceback)``; the coordinator raises ``BenchError`` with
    it and ends the scenario's processes (only those it started)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._procs: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        self.readies: list[Any] = []
        self.reps: list[list[Any]] = []
        self.extras: list[Any] = []

    def start(self) -> None:
        """Start the workers one after the other, each once the previous one is ready."""
        ctx = multiprocessing.get_context("spawn")
        for index, (target, params) in enumerate(self.scenario.workers):
            ours, theirs = ctx.Pipe()
            process = ctx.Process(target=_worker_main, args=(target, theirs, {**params, "peers": list(self.readies)}),
                                  name=f"{self.scenario.name}-{index}")
            process.start()
            theirs.close()
            self._procs.append((process, ours))
            self.readies.append(self._expect(process, ours, "ready"))

    def step(self) -> None:
        """Run the next repetition (the first one is the warm-up) on every worker at once."""
        self.reps.append(self._all(("go", len(self.reps)), "rep"))

    def exchange(self, message: tuple[str, Any], kind: str) -> list[Any]:
        """Send ``message`` to every worker and collect each one's ``kind`` answer (e.g. the full
        list of ready infos once all are up, for workers that must all reach each other)."""
        return self._all(message, kind)

    def stop(self) -> None:
        """Tell the workers to tear down and collect what they report."""
        self.extras = self._all(("stop", None), "done")
        for process, _ in self._procs:
            process.join(self.scenario.step_timeout_s)

    def end(self) -> None:
        """Terminate workers that are still alive (after a failure) and close the pipes."""
        for process, conn in self._procs:
            if process.is_alive():
                process.terminate()
            process.join(10)
            conn.close()

    def outcome(self) -> dict[str, Any]:
        return {"ready": self.readies, "reps": self.reps, "extras": self.extras}

    def _all(self, message: tuple[str, Any], kind: str) -> list[Any]:
        for _, conn in self._procs:
            conn.send(message)
        return [self._expect(process, conn, kind) for process, conn in self._procs]

    def _expect(self, process: multiprocessing.process.BaseProcess, conn: Connection, kind: str) -> Any:
        name, timeout_s = self.scenario.name, self.scenario.step_timeout_s
        if not conn.poll(timeout_s):
            raise BenchError(f"{name}: worker {process.name} sent nothing within {timeout_s} s "
                             f"(exit code {process.exitcode})")
        try:
            got, value = conn.recv()
        except EOFError:
            raise BenchError(f"{name}: worker {process.name} died (exit code {process.exitcode})") from None
        if got == "error":
            raise BenchError(f"{name}: worker {process.name} failed:\n{value}")
        if got != kind:
            raise BenchError(f"{name}: worker {process.name} sent {got!r}, expected {kind!r}")
        return value


def run_interleaved(scenarios: list[Scenario], *, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Start every scenario, then run repetition k of all of them back to back before k + 1.

    Interleaving puts the rows' k-th transfers seconds apart, so that a burst of load on the
    shared machine hits all rows alike instead of one row's whole series. Idle workers block
    on their pipe. Returns each scenario's ready infos, per-repetition results and extras.
    """
    runs = [ScenarioRun(scenario) for scenario in scenarios]
    try:
        for run in runs:
            log(f"starting {run.scenario.name}")
            run.start()
        for rep in range(max(scenario.repeats for scenario in scenarios) + 1):
            log(f"repetition {rep}" + (" (warm-up)" if rep == 0 else ""))
            for run in runs[rep % len(runs):] + runs[:rep % len(runs)]:
                if rep <= run.scenario.repeats:
                    run.step()
        for run in runs:
            run.stop()
        return {run.scenario.name: run.outcome() for run in runs}
    finally:
        for run in runs:
            run.end()


def command_loop(conn: Connection, on_go: Callable[[int], Any]) -> None:
    """Answer ``go`` with ``on_go(index)`` until ``stop`` (the caller then sends ``done``)."""
    while True:
        command, index = conn.recv()
        if command == "stop":
            return
        conn.send(("rep", on_go(index)))


async def async_command_loop(conn: Connection, on_go: Callable[[int], Awaitable[Any]]) -> None:
    """``command_loop`` for a worker running an event loop: the pipe is read in a thread."""
    while True:
        command, index = await asyncio.to_thread(conn.recv)
        if command == "stop":
            return
        conn.send(("rep", await on_go(index)))


async def serve_worker(conn: Connection, on_go: Callable[[int], Awaitable[Any]], *, ready: dict[str, Any],
                       closers: Sequence[Any], done: Callable[[], dict[str, Any]] = dict) -> None:
    """One async worker's life: announce ``ready``, answer "go" until "stop", close ``closers``
    (those not None, in order, even on error), then report ``done()``."""
    try:
        conn.send(("ready", ready))
        await async_command_loop(conn, on_go)
    finally:
        for resource in closers:
            if resource is not None:
                await resource.aclose()
    conn.send(("done", done()))


def make_tensor(size_bytes: int, seed: int) -> torch.Tensor:
    """A float32 tensor of ``size_bytes`` (a multiple of 4) with random values from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(size_bytes // 4, generator=generator, dtype=torch.float32)


def checksum(buffer: Any) -> int:
    """CRC-32 of a buffer's bytes (a tensor is viewed, not copied)."""
    if isinstance(buffer, torch.Tensor):
        buffer = buffer.contiguous().view(torch.uint8).numpy()
    return zlib.crc32(memoryview(buffer).cast("B"))


def summarize(seconds: list[float], payload_bytes: int) -> dict[str, Any]:
    """Median / min / max MB/s of timed transfers of ``payload_bytes`` each."""
    rates = [payload_bytes / MB / s for s in seconds]
    return {"payload_bytes": payload_bytes, "seconds": seconds, "mb_per_s": rates,
            "median_mb_per_s": statistics.median(rates), "min_mb_per_s": min(rates), "max_mb_per_s": max(rates)}

"""TL++ step time, secure vs base, split into compute, share generation and transfer; targets:
secure <= 1.5x base, share generation >= 0.5x the raw keystream (docs/BENCHMARKS.md)::

    .venv/bin/python scripts/bench/tlpp.py [--repeats 30] [--warmup 3] [--batch_size 96] [--profile_steps 10]"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sharing as sharing_bench
import torch
from _common import BenchError
from _tlpp_network import (
    MODES,
    NUM_NODES,
    RequestLog,
    batch_inputs,
    build_networks,
    network_step,
    orchestrator,
    ping_rtt,
    profile_loop,
    request_log,
    schedule,
)
from _tlpp_report import render, summarize
from _tlpp_split import Parties, Stopwatch, base_split, build_parties, raw_keystream, secure_split

from gossamer.crypto.sharing import MaskStream
from gossamer.protocols.tlpp.core import VirtualBatch
from gossamer.protocols.tlpp.settings import TlppSettings
from gossamer_harness.localnet import LocalNet
from gossamer_harness.report import machine, write_result

_HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode first")
    parser.add_argument("--batch_size", type=int, default=96, help=f"virtual batch over {NUM_NODES} nodes")
    parser.add_argument("--share_numel", type=int, default=4 * 1024 * 1024,
                        help="elements of the bulk sharing rows")
    parser.add_argument("--share_repeats", type=int, default=7)
    parser.add_argument("--profile_steps", type=int, default=10,
                        help="profiled steps per mode after the timed ones (0: no profile)")
    parser.add_argument("--json", type=Path, default=_HERE / "results" / "tlpp.json")
    args = parser.parse_args(argv)
    for name, low in (("repeats", 1), ("warmup", 0), ("batch_size", NUM_NODES), ("share_numel", 1),
                      ("share_repeats", 1), ("profile_steps", 0)):
        if getattr(args, name) < low:
            parser.error(f"--{name} must be >= {low}, got {getattr(args, name)}")
    return args


@dataclass
class Setup:
    """What every repetition uses: both networks and their request logs, the split's parties, the batches."""

    nets: dict[str, LocalNet]
    logs: dict[str, RequestLog]
    parties: dict[str, Parties]
    settings: TlppSettings
    batches: list[VirtualBatch]
    device: torch.device


def build_setup(nets: dict[str, LocalNet]) -> Setup:
    server = orchestrator(nets["secure"])
    settings, device = server.settings, server.ctx.device
    batches = schedule(nets["base"], settings)
    if batches != schedule(nets["secure"], settings):
        raise BenchError("the two networks draw different virtual batches")
    parties = {mode: build_parties(settings, sorted(batches[0].by_node()), device) for mode in MODES}
    logs = {mode: request_log(net) for mode, net in nets.items()}
    return Setup(nets, logs, parties, settings, batches, device)


async def mode_step(setup: Setup, mode: str, batch: VirtualBatch) -> dict[str, Any]:
    """One mode's network step on ``batch``, then its split on the same samples."""
    result = await network_step(setup.nets[mode], batch, setup.logs[mode])
    xs, ys = batch_inputs(setup.nets[mode], batch, setup.device)
    watch = Stopwatch()
    if mode == "secure":
        secure_split(setup.parties[mode], xs, ys, watch, settings=setup.settings)
    else:
        base_split(setup.parties[mode], xs, ys, watch)
    return {**result, "split": dict(watch.seconds), "shared_numels": watch.shared_numels}


async def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every repetition: both modes' steps (the order alternates), the raw keystream of the secure
    step's shared tensors, and the empty-request round trip; then the event-loop profiles.

    *Transfer* = whole step - compute - share generation (encoding, AEAD, framing, sockets, the
    event loop, thread hops). The network step's nodes compute concurrently, so on idle cores the
    serial sums overstate their share and the residual understates transfer; and all five parties
    share this process: their request handling runs on ONE event-loop thread, which a deployment
    on separate hosts would run in parallel."""
    nets = await build_networks(args, tmp)
    try:
        setup = build_setup(nets)
        reps: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        extra: dict[str, list[float]] = {"raw_step_keystream_s": [], "ping_rtt_s": []}
        raw_stream = MaskStream()
        for rep in range(args.warmup + args.repeats):
            print(f"step {rep}" + (" (warm-up)" if rep < args.warmup else ""), file=sys.stderr, flush=True)
            for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
                reps[mode].append(await mode_step(setup, mode, setup.batches[rep % len(setup.batches)]))
            numels = reps["secure"][-1]["shared_numels"]
            extra["raw_step_keystream_s"].append(raw_keystream(numels, raw_stream))
            extra["ping_rtt_s"].append(await ping_rtt(nets["secure"], 5))
        profiles = {mode: await profile_loop(nets[mode], setup.batches, setup.logs[mode], args.profile_steps)
                    for mode in MODES} if args.profile_steps > 0 else {}
        timed = slice(args.warmup, None)
        return {"reps": {mode: runs[timed] for mode, runs in reps.items()}, "profiles": profiles,
                **{key: values[timed] for key, values in extra.items()}}
    finally:
        for net in nets.values():
            await net.aclose()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    before = machine()
    with tempfile.TemporaryDirectory(prefix="gossamer-tlpp-bench-") as tmp:
        measured = asyncio.run(measure(args, Path(tmp)))
    sharing_bench.check_correct(1 << 14)
    bulk_rows = sharing_bench.build_rows(args.share_numel)
    bulk_seconds = sharing_bench.run_interleaved(bulk_rows, args.share_repeats)
    summary = summarize(measured, sharing_bench.summarize(bulk_seconds, args.share_numel))
    table = render(summary, args)
    print(table)
    write_result(args.json, {**summary, "table_markdown": table}, before=before, args=args)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0 if summary["step_ratio"]["pass"] and summary["share_gen"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Issue 30, item 7 (context parallelism): a ring of cp-shards on a LocalNet (real TCP frames,
signatures) where one member sends its gradient share sign-flipped x20 to the leader; the step
loss per step and each honest shard's final held-out loss, clean and attacked, with
``hyper.share_clip`` 0 (the exact sum: the code before) and 1 (the default)::

    nice -n 10 .venv/bin/python scripts/chaos/context_byzantine.py [--steps 30] [--shards 4] [--json PATH]"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from gossamer.crypto.identity import Identity
from gossamer_harness.context.byzantine import run_ring
from gossamer_harness.report import load_average_text, machine, markdown_table, write_json

ROOT = Path(__file__).resolve().parents[2]
RUN: dict[str, Any] = {
    "run": {"name": "ring", "protocol": "context", "heartbeat_s": 5.0},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 64, "subspace": {"rank": 2}},
    "hyper": {"chunk_tokens": 16, "batch_size": 4, "min_shards": 2, "step_timeout_s": 60.0,
              "plan_timeout_s": 60.0, "eval_batches": 4, "lr": 0.01},
}
SCENARIOS = {  # name -> (share_clip, attacked)
    "clean_exact_sum": (0.0, False),
    "clean_share_clip": (1.0, False),
    "attacked_exact_sum": (0.0, True),
    "attacked_share_clip": (1.0, True),
}


async def scenario(work: Path, identities: list[Identity], steps: int, share_clip: float, attacked: bool
                   ) -> dict[str, Any]:
    run = {**RUN, "hyper": {**RUN["hyper"], "steps": steps, "share_clip": share_clip}}
    shards = len(identities)
    roles = await run_ring(work, run, identities, byzantine=[shards - 1] if attacked else [])
    honest = roles[:-1] if attacked else roles
    context = shards * roles[0].settings.chunk_tokens
    heldout = [await asyncio.to_thread(role.replica.heldout_loss, role.data.heldout, context=context)
               for role in honest]
    applied = [ledger for ledger in roles[0].runner.history if ledger.applied]
    return {"heldout": [round(h, 4) for h in heldout], "step_loss": [round(loss, 4) for _, loss in
                                                                     roles[0].runner.series["loss"]],
            "clipped_last_steps": [ledger.clipped for ledger in applied]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/context_byzantine.json")
    args = parser.parse_args()
    load_before = load_average_text()
    identities = [Identity.generate() for _ in range(args.shards)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="gossamer-context-byzantine-") as tmp:
        for name, (share_clip, attacked) in SCENARIOS.items():
            started = time.monotonic()
            results[name] = asyncio.run(scenario(Path(tmp) / name, identities, args.steps, share_clip, attacked))
            results[name]["wall_s"] = round(time.monotonic() - started, 1)
            print(f"{name}: held-out {results[name]['heldout']}", flush=True)
    print(markdown_table(["scenario", "held-out (honest shards)", "step loss every 5th step"],
                         [[n, r["heldout"], r["step_loss"][::5]] for n, r in results.items()]))
    write_json(args.json, {"machine": machine(load_before=load_before, load_after=load_average_text()),
                           "steps": args.steps, "shards": args.shards, "scale": -20.0, "run": RUN,
                           "results": results})


if __name__ == "__main__":
    main()

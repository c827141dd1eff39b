#!/usr/bin/env python3
"""FoMoE expert hosts as real daemons through the CLI: ``kill`` (one of four hosts SIGKILLed, the
others re-place its experts and train on) and ``preset`` (``gossamer swarm --preset fomoe``); each
failed check is named and the exit status is 1::

    nice -n 10 .venv/bin/python scripts/chaos/fomoe_hosts.py [--scenario kill|preset|both] [--json PATH]"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from gossamer.transport.safetensors_stream import load_file
from gossamer_harness.fomoe.hosts import kill_one_host
from gossamer_harness.report import load_average_text, write_json

ROOT = Path(__file__).resolve().parents[2]


def preset(work: Path) -> dict[str, Any]:
    """``gossamer swarm --preset fomoe``: 8 rounds, the loss falling, about half the pairs skipped."""
    result = subprocess.run([sys.executable, "-m", "gossamer.peer.cli", "swarm", "--preset", "fomoe", "--workdir",
                             str(work)], capture_output=True, text=True, timeout=900)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    assert "the run is finished (all 4 peers)" in out and "stopped 5 process(es) cleanly" in out, out[-3000:]
    lines = re.findall(r"\[peer-1\] \[[#-]+\] +\d+/8  round \d+: .*?held-out (\d+\.\d+)  experts \[[\d, ]+\]  "
                       r"skipped (\d\.\d+)", out)
    assert len(lines) == 8, out[-3000:]
    heldout, skipped = [float(h) for h, _ in lines], [float(k) for _, k in lines]
    assert heldout[-1] < heldout[0] - 0.3, heldout
    assert 0.35 < sum(skipped) / len(skipped) < 0.65, skipped  # 1 - 4/8 under balanced routing; 0: no skipping
    checkpoints = sorted((work / "checkpoints").glob("fomoe-demo-*-round8.safetensors"))
    assert len(checkpoints) == 4, checkpoints
    held = []
    for path in checkpoints:
        tensors, metadata = load_file(path)
        experts = [int(e) for e in metadata["experts"].split(",")]
        assert metadata["round"] == "8" and len(experts) == 4 and "embed.weight" in tensors
        held += experts
    assert sorted(held) == sorted(list(range(8)) * 2), held  # r = 2: every expert on two hosts
    return {"heldout_peer1": heldout, "skipped_peer1": skipped}


SCENARIOS = {"kill": kill_one_host, "preset": preset}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=[*SCENARIOS, "both"], default="both")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/fomoe_hosts.json")
    args = parser.parse_args()
    chosen = list(SCENARIOS) if args.scenario == "both" else [args.scenario]
    results = []
    for name in chosen:
        load_before, started = load_average_text(), time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"gossamer-fomoe-{name}-") as tmp:
            try:
                seen, failure = SCENARIOS[name](Path(tmp)), ""
            except AssertionError:
                seen, failure = {}, traceback.format_exc()[-2000:]
        results.append({"scenario": name, "passed": not failure, "failure": failure, "seen": seen,
                        "wall_s": round(time.monotonic() - started, 1), "load_before": load_before,
                        "load_after": load_average_text()})
    print("| scenario | passed | wall s | load before / after | seen |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['scenario']} | {'yes' if r['passed'] else 'NO'} | {r['wall_s']} | {r['load_before']} / "
              f"{r['load_after']} | {json.dumps(r['seen']) if r['passed'] else r['failure'][:300]} |")
    write_json(args.json, results)
    sys.exit(0 if all(r["passed"] for r in results) else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""One slow peer of three: wall-clock of a run with fixed deadlines against adaptive pacing, for
DiLoCo (a slow learner), TL++ (a slow data node) or BlockTrain (a slow block worker); real
processes through the CLI on 127.0.0.1, arms alternating ``--repeats`` times each::

    .venv/bin/python scripts/bench/slow_peer.py --protocol {diloco,tlpp,blocktrain} [its flags] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _slowdown import CpuQuota, DutyCycle

from gossamer.crypto.identity import Identity
from gossamer_harness.localproc import LOOPBACK, GossamerProcess
from gossamer_harness.report import load_average_text, machine, markdown_table, write_result

RESULTS = Path(__file__).resolve().parent / "results"
NAMES = ("slow", "fast0", "fast1")
PACINGS = ("fixed", "adaptive")
Run = dict[str, Any]


class Peers:
    """The processes of one run: an orchestrator from ``run.toml`` and the three peers."""

    def __init__(self, work: Path, run_toml: str, *, checkpoint: bool) -> None:
        work.mkdir(parents=True)
        (work / "run.toml").write_text(run_toml)
        self.work, self.procs, self.ids = work, [], {}
        self.peers: dict[str, GossamerProcess] = {}
        keep = ["--checkpoint_dir", str(work / "ckpt")] if checkpoint else []
        self.orch = self._start("orch", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events",
                                         *LOOPBACK, "--threads", "1", "--identity_path", str(work / "owner.pem"),
                                         *keep])
        self.ready = self.orch.wait_ready()

    def _start(self, name: str, args: list[str], wrapper: tuple[str, ...] = ()) -> GossamerProcess:
        proc = GossamerProcess(args, log_path=self.work / f"{name}.log", wrapper=wrapper)
        self.procs.append(proc)
        return proc

    def join(self, name: str, role: str, *extra: str, wrapper: tuple[str, ...] = ()) -> GossamerProcess:
        """Start peer ``name`` with ``role`` in the run, its identity made first (``ids``)."""
        self.ids[name] = Identity.create(self.work / f"{name}.pem").peer_id
        self.peers[name] = self._start(name, ["peer", "--roles", role, "--run", self.ready["run_id"],
                                              "--initial_peers", *self.ready["maddrs"], "--events", *LOOPBACK,
                                              "--threads", "1", "--identity_path", str(self.work / f"{name}.pem"),
                                              *extra], wrapper)
        return self.peers[name]

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


# -- DiLoCo: one slow learner --------------------------------------------------------------------

DILOCO_RUN = """
[run]
name = "slow-learner-bench"
protocol = "diloco"
heartbeat_s = 5.0
[model]
d_model = 32
n_layers = 2
n_heads = 2
context = 32
[hyper]
rounds = {rounds}
batch_size = 8
eval_batches = 2
w1_grace_s = {w1_grace_s}
w2_deadline_s = {w2_deadline_s}
min_learners = 3
pacing = "{pacing}"
[hyper.diloco]
inner_steps = {inner_steps}
inner_lr = 0.003
[hyper.mixing]
w1 = "global"
w2 = "global"
[hyper.aggregator]
name = "mean"
"""


def diloco_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--rounds", type=int, default=16)
    group.add_argument("--inner_steps", type=int, default=30)
    group.add_argument("--w1_grace_s", type=float, default=5.0)
    group.add_argument("--w2_deadline_s", type=float, default=60.0, help="the ceiling")
    group.add_argument("--share", type=float, default=0.25,
                       help="the share of the wall-clock the slow learner runs (a duty cycle)")
    group.add_argument("--timeout_s", type=float, default=1800.0, help="most time one run may take")


def diloco_run(pacing: str, args: argparse.Namespace, work: Path, quota: CpuQuota | None) -> Run:
    """Three learners mixing globally; once all are ready the slow one runs ``--share`` of the time.
    Measured: until both fast learners and until all three finished, the fast ones' held-out loss,
    the share of their rounds that used the slow learner's pseudo-gradient, who was flagged."""
    peers = Peers(work, DILOCO_RUN.format(rounds=args.rounds, inner_steps=args.inner_steps, pacing=pacing,
                                          w1_grace_s=args.w1_grace_s, w2_deadline_s=args.w2_deadline_s),
                  checkpoint=False)
    slowdown: DutyCycle | None = None
    try:
        for name in NAMES:
            peers.join(name, "learner", "--checkpoint_dir", str(work / f"ckpt-{name}"))
        for proc in peers.peers.values():
            proc.wait_ready(timeout_s=300)
        slowdown = DutyCycle(peers.peers["slow"].proc.pid, share=args.share)
        started = time.monotonic()
        finished: dict[str, float] = {}
        rounds: dict[str, list[dict]] = {name: [] for name in NAMES}
        while len(finished) < len(NAMES):
            for name, proc in peers.peers.items():
                if name in finished:
                    continue
                for event in proc.poll_events():
                    if event["event"] == "diloco.round":
                        rounds[name].append(event)
                    elif event["event"] == "diloco.finished":
                        finished[name] = time.monotonic() - started
                        rounds[name].append(event)
                    elif event["event"] == "exited":
                        raise RuntimeError(f"{name} exited: {proc.log()[-2000:]}")
            if time.monotonic() - started > args.timeout_s:
                raise RuntimeError(f"the run did not finish in {args.timeout_s} s: finished {sorted(finished)}")
            time.sleep(0.2)  # polling the processes' event pipes, not synchronising with them
    finally:
        if slowdown is not None:
            slowdown.stop()
        peers.stop()
    ids, fast = peers.ids, ("fast0", "fast1")
    fast_rounds = [e for name in fast for e in rounds[name] if e["event"] == "diloco.round"]
    flagged = {name for name in NAMES for e in fast_rounds if ids[name] in e["slow"]}
    return {"pacing": pacing, "fast_wall_s": max(finished["fast0"], finished["fast1"]),
            "all_wall_s": max(finished.values()),
            "fast_heldout": statistics.mean(next(e["heldout_loss"] for e in reversed(rounds[name])
                                                 if e["event"] == "diloco.finished") for name in fast),
            "initial_heldout": statistics.mean(rounds[name][0]["heldout_loss"] for name in fast),
            "slow_used_share": statistics.mean(ids["slow"] not in e["timed_out"] and e["pgrads_used"] == 2
                                               for e in fast_rounds),
            "slow_flagged": "slow" in flagged, "fast_flagged": bool(flagged - {"slow"}),
            "compute_s": {name: statistics.median(e["compute_s"] for e in rounds[name] if e["event"] == "diloco.round")
                          for name in NAMES},
            "slow_rounds_run": sum(e["event"] == "diloco.round" for e in rounds["slow"]), "load": load_average_text()}


def diloco_progress(run: Run) -> str:
    compute = ", ".join(f"{name} {s:.2f}" for name, s in run["compute_s"].items())
    return (f"fast learners {run['fast_wall_s']:.1f} s, all {run['all_wall_s']:.1f} s, held-out "
            f"{run['fast_heldout']:.3f}, median compute s: {compute}")


def diloco_summary(runs: list[Run]) -> dict[str, Any]:
    summary = {}
    for pacing in PACINGS:
        mine = [r for r in runs if r["pacing"] == pacing]
        summary[pacing] = {key: statistics.median(r[key] for r in mine)
                           for key in ("fast_wall_s", "all_wall_s", "fast_heldout", "initial_heldout", "slow_used_share")}
        summary[pacing].update(slow_flagged=all(r["slow_flagged"] for r in mine),
                               fast_flagged=any(r["fast_flagged"] for r in mine))
    return {"summary": summary,
            "adaptive_over_fixed_fast_wall": summary["adaptive"]["fast_wall_s"] / summary["fixed"]["fast_wall_s"],
            "adaptive_over_fixed_all_wall": summary["adaptive"]["all_wall_s"] / summary["fixed"]["all_wall_s"]}


def diloco_render(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    rows = [[pacing, f"{row['fast_wall_s']:.1f}", f"{row['all_wall_s']:.1f}",
             f"{row['initial_heldout']:.3f} -> {row['fast_heldout']:.3f}", f"{row['slow_used_share']:.0%}",
             yes(row["slow_flagged"]), yes(row["fast_flagged"])] for pacing, row in result["summary"].items()]
    return [f"One slow learner of three (running {args.share:.0%} of the time), global W1/W2, {args.rounds} rounds "
            f"of {args.inner_steps} inner steps, w1_grace_s {args.w1_grace_s:g}, w2_deadline_s {args.w2_deadline_s:g} "
            "(ceiling)",
            markdown_table(["pacing", "fast learners done (s)", "all done (s)",
                            "held-out loss, fast learners (start -> end)", "fast rounds using the slow learner",
                            "slow learner flagged", "a fast learner flagged"], rows),
            f"adaptive / fixed wall-clock: fast learners {result['adaptive_over_fixed_fast_wall']:.2f}, all learners "
            f"{result['adaptive_over_fixed_all_wall']:.2f}"]


# -- TL++: one slow data node --------------------------------------------------------------------

TLPP_RUN = """
[run]
name = "slow-node-bench"
protocol = "tlpp"
heartbeat_s = 1.0
[hyper]
mode = "base"
batch_size = 32
optimizer = "adam"
lr = 0.01
steps = {steps}
eval_every = 0
min_nodes = 3
node_timeout_s = {timeout_s}
pacing = "{pacing}"
node_floor_s = {floor_s}
"""


def tlpp_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--steps", type=int, default=40)
    group.add_argument("--timeout_s", type=float, default=20.0, help="node_timeout_s: the ceiling")
    group.add_argument("--floor_s", type=float, default=0.5,
                       help="node_floor_s of the adaptive arm (the default floor, 5 s, is above what the slow node "
                            "costs a step, so adaptive pacing would wait for it as fixed pacing does)")
    group.add_argument("--share", type=float, default=0.015,
                       help="the slow node's share of one CPU (a cgroup quota: a duty cycle of 1 s does not slow "
                            "steps of tens of milliseconds persistently)")


def tlpp_run(pacing: str, args: argparse.Namespace, work: Path, quota: CpuQuota | None) -> Run:
    """Base mode, digits_cnn, three data nodes on digits shards; every virtual batch waits for each.
    Once ready the slow node moves under the CPU quota. Measured: wall-clock until ``finished``, the
    test loss and accuracy, the share of steps that used the slow node, the mean forward deadline,
    who was flagged."""
    assert quota is not None
    peers = Peers(work, TLPP_RUN.format(steps=args.steps, timeout_s=args.timeout_s, pacing=pacing,
                                        floor_s=args.floor_s), checkpoint=True)
    try:
        for i, name in enumerate(NAMES):
            peers.join(name, "node", "--data", f"builtin:digits:shard={i}/3")
        for proc in peers.peers.values():
            proc.wait_ready(timeout_s=300)
        quota.move(peers.peers["slow"].proc.pid)
        started = time.monotonic()
        steps = []
        while True:
            event = peers.orch.wait_event(lambda e: e["event"] in ("tlpp.step", "tlpp.finished", "tlpp.error"),
                                          timeout_s=args.timeout_s * 4)
            if event["event"] != "tlpp.step":
                break
            steps.append(event)
        wall = time.monotonic() - started
        if event["event"] != "tlpp.finished":
            raise RuntimeError(f"training stopped: {event}")
    finally:
        slow = peers.peers.get("slow")
        if slow is not None and slow.proc.poll() is None:  # back to full speed: it shuts down promptly
            quota.release(slow.proc.pid)
        peers.stop()
    ids = peers.ids
    flagged = {name for name in NAMES for e in steps if ids[name] in e["slow"]}
    return {"pacing": pacing, "wall_s": wall, "test_loss": event["test_loss"],
            "test_accuracy": event["test_accuracy"], "steps": len(steps),
            "slow_used_share": statistics.mean(ids["slow"] in e["used"] for e in steps),
            "fast_always_used": all({ids["fast0"], ids["fast1"]} <= set(e["used"]) for e in steps),
            "mean_forward_deadline_s": statistics.mean(e["deadline_s"]["forward"] for e in steps),
            "first_flagged_step": next((e["step"] for e in steps if ids["slow"] in e["slow"]), None),
            "slow_flagged": "slow" in flagged, "fast_flagged": bool(flagged - {"slow"}), "load": load_average_text()}


def tlpp_progress(run: Run) -> str:
    return (f"{run['wall_s']:.1f} s, test loss {run['test_loss']:.3f}, accuracy {run['test_accuracy']:.3f}, slow "
            f"node used in {run['slow_used_share']:.0%} of steps, flagged from step {run['first_flagged_step']}")


def tlpp_summary(runs: list[Run]) -> dict[str, Any]:
    summary = {}
    for pacing in PACINGS:
        mine = [r for r in runs if r["pacing"] == pacing]
        summary[pacing] = {key: statistics.median(r[key] for r in mine)
                           for key in ("wall_s", "test_loss", "test_accuracy", "slow_used_share",
                                       "mean_forward_deadline_s")}
        summary[pacing].update(slow_flagged=all(r["slow_flagged"] for r in mine),
                               fast_flagged=any(r["fast_flagged"] for r in mine),
                               fast_always_used=all(r["fast_always_used"] for r in mine))
    return {"summary": summary, "adaptive_over_fixed_wall": summary["adaptive"]["wall_s"] / summary["fixed"]["wall_s"]}


def tlpp_render(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    rows = [[pacing, f"{row['wall_s']:.1f}", f"{row['test_loss']:.3f} / {row['test_accuracy']:.3f}",
             f"{row['slow_used_share']:.0%}", f"{row['mean_forward_deadline_s']:.1f}", yes(row["slow_flagged"]),
             yes(row["fast_flagged"] or not row["fast_always_used"])] for pacing, row in result["summary"].items()]
    return [f"One slow data node of three (a {args.share:.1%} CPU quota), base mode, {args.steps} steps, "
            f"node_timeout_s {args.timeout_s:g} (ceiling), adaptive node_floor_s {args.floor_s:g}",
            markdown_table(["pacing", "wall-clock (s)", "held-out loss / accuracy", "steps using the slow node",
                            "mean forward deadline (s)", "slow node flagged", "a fast node flagged or dropped"], rows),
            f"adaptive / fixed wall-clock: {result['adaptive_over_fixed_wall']:.2f}"]


# -- BlockTrain: one slow block worker -----------------------------------------------------------

BLOCKTRAIN_RUN = """
[run]
name = "slow-bench"
protocol = "blocktrain"
heartbeat_s = 1.0
[model]
d_model = 32
n_heads = 2
context = 32
num_blocks = 1
[hyper]
versions = {versions}
local_steps = {local_steps}
batch_size = 8
lr = 0.003
deadline_s = {deadline_s}
eval_batches = 2
min_workers = 3
pacing = "{pacing}"
"""


def blocktrain_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--versions", type=int, default=30)
    group.add_argument("--local_steps", type=int, default=40)
    group.add_argument("--deadline_s", type=float, default=60.0, help="the ceiling")
    group.add_argument("--share", type=float, default=0.2, help="the slow worker's share of one CPU (a cgroup quota)")


def blocktrain_run(pacing: str, args: argparse.Namespace, work: Path, quota: CpuQuota | None) -> Run:
    """Three block workers train the same single block, the slow one under the CPU quota from its
    start. Measured from the moment all three are assigned: wall-clock until ``finished``, the
    held-out CE, the updates used per version, who was flagged."""
    assert quota is not None
    peers = Peers(work, BLOCKTRAIN_RUN.format(versions=args.versions, local_steps=args.local_steps,
                                              deadline_s=args.deadline_s, pacing=pacing), checkpoint=True)
    try:
        for name in NAMES:  # training starts once all three are live (min_workers)
            proc = peers.join(name, "block-worker", wrapper=quota.wrapper if name == "slow" else ())
            if name == "slow":
                proc.wait_ready(timeout_s=300)
        ids = peers.ids
        everyone = set(ids.values())
        peers.orch.wait_event(lambda e: e["event"] == "blocktrain.assignment" and everyone <= set(e["assignment"]),
                              timeout_s=120)
        started = time.monotonic()
        versions = []
        while True:
            event = peers.orch.wait_event(lambda e: e["event"] in ("blocktrain.version", "blocktrain.finished"),
                                          timeout_s=args.deadline_s * 3)
            if event["event"] == "blocktrain.finished":
                break
            versions.append({"used": len(event["used"]), "slow_used": ids["slow"] in event["used"],
                             "deadline_s": event["deadline_s"],
                             "flagged": [name for name, peer in ids.items() if peer in event["slow"]]})
        wall = time.monotonic() - started
    finally:
        peers.stop()
    return {"pacing": pacing, "wall_s": wall, "heldout_ce": event["heldout_ce"],
            "initial_heldout_ce": event["initial_heldout_ce"], "versions": versions,
            "slow_flagged": any("slow" in v["flagged"] for v in versions),
            "fast_flagged": any(set(v["flagged"]) - {"slow"} for v in versions), "load": load_average_text()}


def blocktrain_progress(run: Run) -> str:
    return f"{run['wall_s']:.1f} s, held-out CE {run['heldout_ce']:.3f}"


def blocktrain_summary(runs: list[Run]) -> dict[str, Any]:
    summary = {}
    for pacing in PACINGS:
        mine = [r for r in runs if r["pacing"] == pacing]
        summary[pacing] = {"wall_s": statistics.median(r["wall_s"] for r in mine),
                           "heldout_ce": statistics.median(r["heldout_ce"] for r in mine),
                           "initial_heldout_ce": mine[0]["initial_heldout_ce"],
                           "slow_used_share": statistics.mean(v["slow_used"] for r in mine for v in r["versions"]),
                           "mean_deadline_s": statistics.mean(v["deadline_s"] for r in mine for v in r["versions"]),
                           "slow_flagged": all(r["slow_flagged"] for r in mine),
                           "fast_flagged": any(r["fast_flagged"] for r in mine)}
    return {"summary": summary, "adaptive_over_fixed_wall": summary["adaptive"]["wall_s"] / summary["fixed"]["wall_s"]}


def blocktrain_render(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    rows = [[pacing, f"{row['wall_s']:.1f}", f"{row['initial_heldout_ce']:.3f} -> {row['heldout_ce']:.3f}",
             f"{row['slow_used_share']:.0%}", f"{row['mean_deadline_s']:.1f}", yes(row["slow_flagged"]),
             yes(row["fast_flagged"])] for pacing, row in result["summary"].items()]
    return [f"One slow worker of three (a {args.share:.0%} CPU quota), one block, {args.versions} versions of "
            f"{args.local_steps} steps, deadline_s {args.deadline_s:g} (ceiling)",
            markdown_table(["pacing", "wall-clock (s)", "held-out CE (start -> end)", "versions using the slow worker",
                            "mean wait allowed (s)", "slow worker flagged", "a fast worker flagged"], rows),
            f"adaptive / fixed wall-clock: {result['adaptive_over_fixed_wall']:.2f}"]


# -- the benchmark -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bench:
    """One protocol's slow-peer benchmark: its flags, one run of an arm, the summary, the tables."""

    party: str
    flags: Callable[[argparse._ArgumentGroup], None]
    run: Callable[[str, argparse.Namespace, Path, CpuQuota | None], Run]
    progress: Callable[[Run], str]
    summarise: Callable[[list[Run]], dict[str, Any]]
    render: Callable[[dict[str, Any], argparse.Namespace], list[str]]
    cgroup: bool
    """whether the slow peer runs under a ``CpuQuota`` (root) rather than a ``DutyCycle``"""


BENCHES = {
    "diloco": Bench("learner", diloco_flags, diloco_run, diloco_progress, diloco_summary, diloco_render, False),
    "tlpp": Bench("node", tlpp_flags, tlpp_run, tlpp_progress, tlpp_summary, tlpp_render, True),
    "blocktrain": Bench("worker", blocktrain_flags, blocktrain_run, blocktrain_progress, blocktrain_summary,
                        blocktrain_render, True),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--protocol", choices=BENCHES)
    protocol = first.parse_known_args(argv)[0].protocol
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=None if protocol else "Each protocol's own flags: --protocol P --help.")
    parser.add_argument("--protocol", choices=BENCHES, required=True,
                        help="diloco: a slow learner; tlpp: a slow data node; blocktrain: a slow block worker")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm (fixed, adaptive), alternating")
    parser.add_argument("--json", type=Path, help="default: scripts/bench/results/slow_<learner|node|worker>.json")
    if protocol is not None:
        BENCHES[protocol].flags(parser.add_argument_group(f"{protocol} (a slow {BENCHES[protocol].party})"))
    args = parser.parse_args(argv)
    args.json = args.json or RESULTS / f"slow_{BENCHES[args.protocol].party}.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = BENCHES[args.protocol]
    before = machine()
    quota = CpuQuota(args.share, script="slow_peer.py") if bench.cgroup else None
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix=f"gossamer-slow-{bench.party}-") as tmp:
            for repeat in range(args.repeats):
                for pacing in PACINGS:
                    runs.append(bench.run(pacing, args, Path(tmp) / f"{pacing}{repeat}", quota))
                    print(f"{pacing:8s} repeat {repeat}: {bench.progress(runs[-1])}; load {runs[-1]['load']}",
                          flush=True)
    finally:
        if quota is not None:
            quota.remove()
    result = bench.summarise(runs)
    heading, table, ratio = bench.render(result, args)
    print(f"\n{heading}; median of {args.repeats}; load before {' / '.join(f'{x:.2f}' for x in before['load_average'])}, "
          f"after {load_average_text()}\n\n{table}\n\n{ratio}")
    write_result(args.json, {**result, "runs": runs}, before=before, args=args, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Training over emulated WAN links end to end: gossamer learners (DiLoCo, gossip) vs hivemind's
Optimizer, same model, data and AdamW per peer; JSON and a PNG of loss vs wall-clock (docs/BENCHMARKS.md)::

    nice -n 10 .venv/bin/python scripts/bench/wan_training.py [--peers 3] [--budget_s 150] [--mbit 100] [--link access|pair]"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from _wan_links import Links, free_port
from _wan_training_report import plot, render, summarise

from gossamer.crypto.identity import Identity
from gossamer.protocols.core.models import ModelConfig, build_model
from gossamer.protocols.core.text_data import evaluate, load_text, split_text
from gossamer.protocols.diloco.core.replica import DilocoConfig
from gossamer_harness.localproc import GossamerProcess
from gossamer_harness.report import load_average, machine, write_json, write_result
from gossamer_harness.wan import LinkProfile

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ARMS = ("gossamer_diloco", "gossamer_gossip", "hivemind_sync", "hivemind_local")
EXTRA_ARMS = ("gossamer_gossip_avg",)  # only when named in --arms
W2_SUBSET = ["embed", "pos", "blocks.0", "norm_f", "head"]  # docs/EXPERIMENTS.md's subset: embeddings + layer0 + head
FAILURE_WORDS = {"gossamer": ("ERROR", "Traceback"),
                 "hivemind": ("failed", "Failed", "timed out", "TimeoutError", "Traceback", "Exception")}
START_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Settings:
    peers: int
    budget_s: float
    mbit: float
    latency_ms: float
    link: str
    d_model: int
    n_layers: int
    n_heads: int
    context: int
    batch_size: int
    inner_steps: int
    sync_accumulate: int
    eval_batches: int
    eval_every_s: float
    seed: int

    @property
    def model(self) -> dict[str, int]:
        return {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads, "context": self.context}


@dataclass(frozen=True)
class PeerIdentity:
    path: Path
    peer_id: str
    shard: int
    sampler_seed: int


def make_identities(work: Path, count: int) -> list[PeerIdentity]:
    """``count`` identities whose shard indices (peer id mod count, as a learner computes it) differ."""
    made: list[PeerIdentity] = []
    attempt = 0
    while len(made) < count:
        path = work / f"peer{attempt}.pem"
        peer_id = Identity.create(path).peer_id
        attempt += 1
        shard_index = int(peer_id[:8], 16) % count
        if shard_index not in {p.shard for p in made}:
            made.append(PeerIdentity(path, peer_id, shard_index, int(peer_id[:15], 16)))
    return made


# --- gossamer arms --------------------------------------------------------------------------------


RUN_TOML = """
[run]
name = "wan-{arm}"
protocol = "diloco"
[model]
{model}
[data]
source = "builtin:pydoc"
[hyper]
rounds = 0
batch_size = {batch_size}
seed = {seed}
num_shards = {peers}
eval_batches = {eval_batches}
min_learners = {peers}
[hyper.diloco]
inner_steps = {inner_steps}
{outer}
[hyper.mixing]
{mixing}
[hyper.aggregator]
name = "mean"
"""
MIXING = {"gossamer_diloco": 'w1 = "global"\nw2 = "global"',
          "gossamer_gossip": f'w1 = "ring"\nw2 = "ring"\nw2_subset = {json.dumps(W2_SUBSET)}'}
MIXING["gossamer_gossip_avg"] = MIXING["gossamer_gossip"]
# gossip (g) with plain averaging for its outer step (lr 1, no momentum), hivemind local updates' rule
OUTER = {"gossamer_gossip_avg": "outer_lr = 1.0\nouter_momentum = 0.0"}


def run_gossamer(arm: str, s: Settings, work: Path, links: Links, ids: list[PeerIdentity]) -> dict[str, Any]:
    model = "\n".join(f"{k} = {v}" for k, v in s.model.items())
    (work / "run.toml").write_text(RUN_TOML.format(arm=arm, model=model, batch_size=s.batch_size, seed=s.seed,
                                                   peers=s.peers, eval_batches=s.eval_batches,
                                                   inner_steps=s.inner_steps, mixing=MIXING[arm],
                                                   outer=OUTER.get(arm, "")))
    orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", "--host",
                            "127.0.0.1", "--host_maddrs", "/ip4/127.0.0.1/tcp/0", "--identity_path",
                            str(work / "owner.pem")], log_path=work / "orchestrator.log")
    procs: list[GossamerProcess] = []
    try:
        ready = orch.wait_ready(timeout_s=START_TIMEOUT_S)
        fronts = []
        for i, ident in enumerate(ids):
            http, tcp, dht = (links.reserve(ident.peer_id) for _ in range(3))
            dht_port = free_port()
            links.connect(dht, dht_port)
            procs.append(GossamerProcess(
                ["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles", "learner",
                 "--events", "--host", "127.0.0.1", "--host_maddrs", f"/ip4/127.0.0.1/tcp/{dht_port}",
                 "--announce_maddrs", f"/ip4/127.0.0.1/tcp/{dht.port}", "--announce_http_port", str(http.port),
                 "--announce_tcp_port", str(tcp.port), "--threads", "1", "--identity_path", str(ident.path),
                 "--checkpoint_dir", str(work / "checkpoints"), "--checkpoint_every", "0"],
                log_path=work / f"learner{i}.log"))
            fronts.append((http, tcp))
        for proc, (http, tcp) in zip(procs, fronts, strict=True):
            listening = proc.wait_ready(timeout_s=START_TIMEOUT_S)["listening"]
            links.connect(http, int(listening["http"].rsplit(":", 1)[1]))
            links.connect(tcp, int(listening["tcp"].rsplit(":", 1)[1]))
        t0 = time.time()
        events = collect(procs, until=t0 + s.budget_s, stop_when=lambda _events: False)
    finally:
        codes = [proc.stop() for proc in procs]
        orch.stop()
    peers = []
    for i, (ident, proc_events, code) in enumerate(zip(ids, events, codes, strict=True)):
        rounds = [e for e in proc_events if e["event"] == "diloco.round"]
        peers.append({
            "peer_id": ident.peer_id, "shard": ident.shard, "exit_code": code,
            "samples": [[e["read_wall_time"] - t0, e["heldout_loss"]] for e in rounds],
            "rounds": [{k: e[k] for k in ("round", "heldout_loss", "train_loss", "compute_s", "wall_s", "w1_wait_s",
                                          "w2_wait_s", "eval_s", "bytes_sent", "bytes_received", "partial",
                                          "problems", "params_from", "pgrads_used", "timed_out")}
                       | {"t": e["read_wall_time"] - t0} for e in rounds],
            "compute_s": sum(e["compute_s"] for e in rounds),
            "blocking_s": sum(e["w1_wait_s"] + e["w2_wait_s"] for e in rounds),
            "eval_s": sum(e["eval_s"] for e in rounds), "wall_s": sum(e["wall_s"] for e in rounds),
            "first_round_at_s": rounds[0]["read_wall_time"] - t0 - rounds[0]["wall_s"] if rounds else None,
            "partial_rounds": sum(bool(e["partial"]) for e in rounds),
            "unbalanced_rounds": sum(bool(e["problems"]) for e in rounds),
            "app_bytes_sent": sum(e["bytes_sent"] for e in rounds),
            "other_events": [e for e in proc_events if e["event"] not in ("diloco.round", "peers")][:50],
            **failure_lines(work / f"learner{i}.log", FAILURE_WORDS["gossamer"]),
        })
    return {"t0": t0, "peers": peers}


# --- hivemind arms --------------------------------------------------------------------------------


def run_hivemind(arm: str, s: Settings, work: Path, links: Links, ids: list[PeerIdentity]) -> dict[str, Any]:
    mode = arm.removeprefix("hivemind_")
    per_epoch = s.sync_accumulate if mode == "sync" else s.inner_steps
    inner = DilocoConfig()  # the learners' inner AdamW: the gossamer arms use its defaults too
    common = ["--mode", mode, "--run_id", f"wan_{arm}", "--model", json.dumps(s.model), "--seed", str(s.seed),
              "--num_shards", str(s.peers), "--batch_size", str(s.batch_size),
              "--target_batch_size", str(s.peers * s.batch_size * per_epoch), "--inner_lr", str(inner.inner_lr),
              "--weight_decay", str(inner.inner_weight_decay), "--betas", *map(str, inner.inner_betas),
              "--grad_clip", str(inner.grad_clip), "--heldout_fraction", "0.05",
              "--eval_batches", str(s.eval_batches), "--eval_every_s", str(s.eval_every_s),
              "--matchmaking_time_s", "5.0", "--averaging_timeout_s", "60.0"]
    procs: list[GossamerProcess] = []
    initial: list[str] = []
    try:
        for i, ident in enumerate(ids):
            front, host_port = links.reserve(ident.peer_id), free_port()
            links.connect(front, host_port)
            procs.append(GossamerProcess(
                [*common, "--host_port", str(host_port), "--announce_port", str(front.port), "--shard",
                 str(ident.shard), "--sampler_seed", str(ident.sampler_seed), "--initial_peers", *initial],
                program=[sys.executable, str(HERE / "_wan_hivemind_peer.py")], log_path=work / f"hivemind{i}.log",
                stdin=subprocess.PIPE))
            if i == 0:  # the others join the first one's DHT (through its link)
                initial = procs[0].wait_ready(timeout_s=START_TIMEOUT_S)["maddrs"]
        for proc in procs[1:]:
            proc.wait_ready(timeout_s=START_TIMEOUT_S)
        t0 = time.time()
        for proc in procs:
            assert proc.proc.stdin is not None
            proc.proc.stdin.write(f"{s.budget_s}\n".encode())
            proc.proc.stdin.flush()
        events = collect(procs, until=t0 + s.budget_s + 120.0,
                         stop_when=lambda evs: all(any(e["event"] == "done" for e in pe) for pe in evs))
    finally:
        codes = [stop_after_exit(proc) for proc in procs]
    peers = []
    for i, (ident, proc_events, code) in enumerate(zip(ids, events, codes, strict=True)):
        evals = [e for e in proc_events if e["event"] == "eval"]
        done = next((e for e in proc_events if e["event"] == "done"), None)
        peers.append({
            "peer_id": ident.peer_id, "shard": ident.shard, "exit_code": code,
            "samples": [[e["wall_time"] - t0, e["heldout_loss"]] for e in evals],
            "evals": evals, "done": done,
            "compute_s": done["compute_s"] if done else 0.0, "blocking_s": done["blocking_s"] if done else 0.0,
            "eval_s": done["eval_s"] if done else 0.0, "wall_s": done["wall_s"] if done else 0.0,
            "epochs": done["epochs"] if done else 0, "steps": done["steps"] if done else 0,
            **failure_lines(work / f"hivemind{i}.log", FAILURE_WORDS["hivemind"]),
        })
    return {"t0": t0, "peers": peers}


# --- driving --------------------------------------------------------------------------------------


def collect(procs: list[GossamerProcess], *, until: float, stop_when) -> list[list[dict[str, Any]]]:
    """Every event of every process until the wall-clock time ``until`` or ``stop_when(events)``."""
    events: list[list[dict[str, Any]]] = [[] for _ in procs]
    while time.time() < until and not stop_when(events):
        open_pipes = [p.proc.stdout for p in procs if p.proc.stdout is not None and p.proc.poll() is None]
        if open_pipes:
            select.select(open_pipes, [], [], max(0.0, min(0.5, until - time.time())))
        else:
            time.sleep(max(0.0, min(0.5, until - time.time())))  # all exited: nothing to wait on but the clock
        for proc, proc_events in zip(procs, events, strict=True):
            proc_events.extend(proc.drain())
    for proc, proc_events in zip(procs, events, strict=True):
        proc_events.extend(proc.drain())
    return events


def stop_after_exit(proc: GossamerProcess, grace_s: float = 30.0) -> int:
    """Give a process that printed ``done`` time to shut its DHT and averager down, then stop it
    and whatever it left in its process group (hivemind's DHT and averager processes outlived a
    peer that exited, and kept taking CPU from the next arms)."""
    try:
        proc.proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    code = proc.stop()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.proc.pid, signal.SIGKILL)
    return code


def failure_lines(log: Path, words: tuple[str, ...]) -> dict[str, Any]:
    """How many lines of a peer's log report a failure, and the first few."""
    lines = [line[:300] for line in log.read_text(errors="replace").splitlines() if any(w in line for w in words)]
    return {"failure_log_lines": len(lines), "failure_examples": lines[:5]}


def untrained_loss(s: Settings) -> float:
    """Held-out loss of the shared initialisation (every arm's start), the trivial baseline."""
    config = ModelConfig.from_dict(s.model)
    split = split_text(load_text("builtin:pydoc"), heldout_fraction=0.05)
    return evaluate(build_model(config, seed=s.seed), split.heldout, context=config.context,
                    max_batches=s.eval_batches, device="cpu")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=ARMS + EXTRA_ARMS, default=list(ARMS),
                        help="gossamer_gossip_avg (not run by default): gossip with a plain-averaging outer step")
    parser.add_argument("--peers", type=int, default=3)
    parser.add_argument("--budget_s", type=float, default=150.0)
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument("--latency_ms", type=float, default=50.0)
    parser.add_argument("--link", choices=("access", "pair"), default="access",
                        help="access: a peer's connections share its --mbit line; pair: --mbit per connection")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--n_layers", type=int, default=4)
    parser.add_argument("--n_heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--inner_steps", type=int, default=30,
                        help="H (DiLoCo) and the local-updates period: at 8 (~3 s of compute) hivemind's background "
                             "averaging (5 s of matchmaking) blocked the next epoch")
    parser.add_argument("--sync_accumulate", type=int, default=0,
                        help="hivemind sync: micro-batches per peer per global step (0: H, DiLoCo's period)")
    parser.add_argument("--eval_batches", type=int, default=1)
    parser.add_argument("--eval_every_s", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="folder for logs (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/bench/results/wan_training.json")
    parser.add_argument("--report_only", action="store_true",
                        help="re-summarise and re-plot --json from its samples, without running anything")
    args = parser.parse_args()
    if args.report_only:
        report = json.loads(args.json.read_text())
        report["summary"] = summarise(report)
        write_json(args.json, report)
        plot(report, args.json.with_suffix(".png"))
        print(render(report))
        return 0
    args.sync_accumulate = args.sync_accumulate or args.inner_steps
    s = Settings(**{k: getattr(args, k) for k in Settings.__dataclass_fields__})
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="wan_training_"))
    work.mkdir(parents=True, exist_ok=True)
    ids = make_identities(work, s.peers)
    baseline = untrained_loss(s)
    n_params = sum(p.numel() for p in build_model(ModelConfig.from_dict(s.model), seed=s.seed).parameters())
    links = Links(LinkProfile.from_mbit(s.mbit, s.latency_ms), shared=s.link == "access")
    before = machine()
    arms: dict[str, Any] = {}
    try:
        for arm in args.arms:
            arm_work = work / arm
            arm_work.mkdir(exist_ok=True)
            load_before = load_average()
            print(f"[{arm}] starting ({s.peers} peers, {s.budget_s:.0f} s)", file=sys.stderr, flush=True)
            run = run_gossamer if arm.startswith("gossamer") else run_hivemind
            result = run(arm, s, arm_work, links, ids)
            result.update(wire_bytes=links.wire_bytes(), proxy=links.stats(),
                          load_before=load_before, load_after=load_average())
            links.close_proxies()
            arms[arm] = result
            print(f"[{arm}] done; logs in {arm_work}", file=sys.stderr, flush=True)
    finally:
        links.close()
    report = {"settings": asdict(s), "parameters": n_params, "model_mb_fp32": n_params * 4 / 1e6,
              "untrained_loss": baseline, "arms": arms}
    report = write_result(args.json, {**report, "summary": summarise(report)}, before=before)
    png = args.json.with_suffix(".png")
    plot(report, png)
    print(render(report))
    print(f"\nJSON: {args.json}\nPNG: {png}\nlogs: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""FoMoE on the network vs the protocol it implements: four ``expert-host`` roles on LocalNet
(``gossamer_harness.localnet``) against ``protocols.fomoe.core.simulate_round`` (every host's loss
and every parameter must equal it), then r = 1, 2, 4 and a host killed mid-run (docs/EXPERIMENTS.md)::

    nice -n 10 .venv/bin/python scripts/experiments/fomoe_network.py [--seeds 0 1] [--quick]"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS_DIR, set_up

from gossamer.crypto.identity import Identity
from gossamer.peer.run.manifest import run_config_from_dict
from gossamer.protocols.core.models import load_parameters
from gossamer.protocols.core.text_data import BatchSampler, evaluate, load_text, shard, split_text
from gossamer.protocols.fomoe.core import (
    FomoeReplica,
    all_to_all_bytes,
    build_moe_model,
    global_parameters,
    place_experts,
    simulate_round,
)
from gossamer.protocols.fomoe.host import ExpertHostRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet
from gossamer_harness.report import machine, markdown_table, write_result

HOSTS = 4


@dataclass(frozen=True, kw_only=True)
class Settings:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    context: int = 64
    n_experts: int = 8
    top_k: int = 2
    batch_size: int = 16
    inner_steps: int = 20
    rounds: int = 12
    inner_lr: float = 3e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    aux_loss_weight: float = 0.01
    eval_batches: int = 4
    """Per host and round (the host's own loss, with its experts only)."""
    final_eval_batches: int = 32
    """The swarm's model at the end, every expert run (32 x 32 windows)."""
    kill_after: int = 4

    def run(self, *, seed: int, replication: int) -> dict[str, Any]:
        return {"run": {"name": "fomoe-network", "protocol": "fomoe", "heartbeat_s": 30.0},
                "model": {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
                          "context": self.context, "n_experts": self.n_experts, "top_k": self.top_k},
                "hyper": {"rounds": self.rounds, "batch_size": self.batch_size, "seed": seed, "num_shards": HOSTS,
                          "eval_batches": self.eval_batches, "min_hosts": HOSTS, "update_deadline_s": 120.0,
                          "commit_deadline_s": 120.0,
                          "diloco": {"inner_steps": self.inner_steps, "inner_lr": self.inner_lr,
                                     "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum},
                          "fomoe": {"replication": replication, "aux_loss_weight": self.aux_loss_weight}}}


def identities(seed: int) -> list[Identity]:
    """Four identities derived from ``seed``, on shards 0, 1, 2, 3 (shard = peer id mod 4)."""
    by_shard: dict[int, Identity] = {}
    k = 0
    while len(by_shard) < HOSTS:
        identity = Identity.from_private_bytes(hashlib.sha256(f"fomoe-network {seed} {k}".encode()).digest())
        by_shard.setdefault(int(identity.peer_id[:8], 16) % HOSTS, identity)
        k += 1
    return [by_shard[i] for i in range(HOSTS)]


def final_loss(params: dict[str, torch.Tensor], s: Settings, seed: int, heldout: torch.Tensor,
               device: torch.device) -> float:
    settings = PLUGINS.plugin("fomoe").read_settings(run_config_from_dict(s.run(seed=seed, replication=2)))
    model = build_moe_model(settings.model, seed=seed, device=device)
    load_parameters(model, params)
    return evaluate(model, heldout, context=s.context, max_batches=s.final_eval_batches, device=device)


async def network(s: Settings, seed: int, replication: int, workdir: Path, *, kill: bool = False) -> dict[str, Any]:
    net = await LocalNet.create(s.run(seed=seed, replication=replication), plugins=PLUGINS, workdir=workdir)
    try:
        roles: list[ExpertHostRole] = [(await net.add(f"h{i}", ("expert-host",), identity=identity)).role  # type: ignore[misc]
                                       for i, identity in enumerate(identities(seed))]
        started = time.perf_counter()
        await net.start()
        live = roles
        if kill:
            assert await net.peers["h0"].ctx.until_view(lambda: roles[3].round >= s.kill_after, timeout_s=1800)
            await net.kill("h3")
            net.forget("h3")  # its record expired
            await net.publish()
            live = roles[:3]
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in live)), timeout=3600)
        wall = time.perf_counter() - started
        placement = live[0].placement
        assert placement is not None and all(role.finished for role in live), "a host did not finish"
        rounds = []
        for t in range(s.rounds):
            by_host = {i: role.history.get(t) for i, role in enumerate(live)}
            ledgers = [ledger for ledger in by_host.values() if ledger is not None]
            rounds.append({"round": t, "heldout_by_host": {i: x.heldout_loss for i, x in by_host.items() if x is not None},
                           "notes": {i: x.note for i, x in by_host.items() if x is not None and x.note},
                           "skip_fraction": sum(x.skip_fraction for x in ledgers) / len(ledgers),
                           "update_bytes": sum(x.update_bytes_sent for x in ledgers),
                           "used": [len(x.updates.used) for x in ledgers], "lost": sorted({e for x in ledgers
                                                                                            for e in x.lost}),
                           "left": sorted({p for x in ledgers for p in x.left})})
        params = {role.peer_id: {n: p.detach().clone() for n, p in role.replica.module.named_parameters()}
                  for role in live}
        first = live[0]
        swarm = {n: t for n, t in params[first.peer_id].items() if n in first.replica.layout.dense}
        for key, names in first.replica.layout.units.items():
            swarm.update({n: params[placement.holders[key[1]][0]][n] for n in names})
        expected = all_to_all_bytes(first.replica.layout, placement)
        return {"rounds": rounds, "params": params, "swarm": swarm, "wall_s": wall,
                "formula_bytes": expected.up_bytes + expected.counts_bytes,
                "holders": [len(h) for h in placement.holders], "members": len(placement.peers)}
    finally:
        await net.aclose()


class Resident(torch.nn.Module):
    """A replica's model as its host evaluates it: only its resident experts run."""

    def __init__(self, replica: FomoeReplica) -> None:
        super().__init__()
        self.model, self.resident = replica.module, sorted(replica.resident)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens, resident=self.resident)


def simulation(s: Settings, seed: int, device: torch.device) -> dict[str, Any]:
    """The same four peers through ``simulate_round``, built as a host builds itself."""
    settings = PLUGINS.plugin("fomoe").read_settings(run_config_from_dict(s.run(seed=seed, replication=2)))
    split = split_text(load_text(settings.text.data_source), heldout_fraction=settings.text.heldout_fraction)
    ids = [identity.peer_id for identity in identities(seed)]
    placement = place_experts(ids, n_experts=s.n_experts, replication=2, round=0, seed=seed)
    replicas = [FomoeReplica(p, build_moe_model(settings.model, seed=seed, device=device), placement.resident(p),
                             diloco=settings.diloco, fomoe=settings.fomoe) for p in ids]
    samplers = [BatchSampler(shard(split.train, index=int(p[:8], 16) % HOSTS, count=HOSTS), batch_size=s.batch_size,
                             context=s.context, generator=torch.Generator().manual_seed(int(p[:15], 16))) for p in ids]
    started, rounds = time.perf_counter(), []
    for t in range(s.rounds):
        simulate_round(replicas, placement, lambda i, _r, _k: samplers[i].sample(device))
        losses = {}
        for i, replica in enumerate(replicas):
            losses[i] = evaluate(Resident(replica), split.heldout, context=s.context, max_batches=s.eval_batches,
                                 device=device)
        rounds.append({"round": t, "heldout_by_host": losses})
    params = {r.sender: {n: p.detach().clone() for n, p in r.module.named_parameters()} for r in replicas}
    return {"rounds": rounds, "params": params, "swarm": global_parameters(replicas, placement),
            "wall_s": time.perf_counter() - started, "heldout": split.heldout}


def max_difference(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[p][n] - b[p][n]).abs().max()) for p in a for n in a[p])


def unigram_loss(split_train: torch.Tensor, heldout: torch.Tensor) -> float:
    counts = torch.ones(256, dtype=torch.float64) + torch.bincount(split_train.long(), minlength=256).double()
    return float(-(counts / counts.sum()).log()[heldout.long()].mean())


ARMS = (("network r = 4 (full replica)", 4, False), ("network r = 2", 2, False), ("network r = 1", 1, False),
        ("network r = 2, host 3 killed", 2, True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 4 steps: checks the script runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--arms", nargs="+", default=[label for label, _, _ in ARMS], help="network arms to run")
    args = parser.parse_args(argv)
    before = machine()
    device = set_up(args.device)
    s = Settings()
    if args.quick:
        s = replace(s, rounds=3, inner_steps=4, kill_after=1, final_eval_batches=4)
    split = split_text(load_text("builtin:pydoc"), heldout_fraction=0.05)
    baseline = unigram_loss(split.train, split.heldout)
    results: dict[str, Any] = {"settings": asdict(s), "unigram_loss": baseline, "seeds": {}}
    for seed in args.seeds:
        sim = simulation(s, seed, device)
        per_seed: dict[str, Any] = {"simulation": {"final_loss": final_loss(sim["swarm"], s, seed, sim["heldout"],
                                                                            device),
                                                   "rounds": sim["rounds"], "wall_s": sim["wall_s"]}}
        for label, replication, kill in [arm for arm in ARMS if arm[0] in args.arms]:
            with tempfile.TemporaryDirectory(prefix="gossamer-fomoe-network-") as tmp:
                net = asyncio.run(network(s, seed, replication, Path(tmp), kill=kill))
            arm = {"final_loss": final_loss(net["swarm"], s, seed, sim["heldout"], device), "rounds": net["rounds"],
                   "wall_s": net["wall_s"], "formula_update_bytes": net["formula_bytes"], "holders": net["holders"],
                   "members": net["members"]}
            if replication == 2 and not kill:
                arm["max_param_difference_vs_simulation"] = max_difference(net["params"], sim["params"])
                arm["max_heldout_difference_vs_simulation"] = max(
                    abs(loss - sim_round["heldout_by_host"][host])
                    for net_round, sim_round in zip(net["rounds"], sim["rounds"], strict=True)
                    for host, loss in net_round["heldout_by_host"].items())
                arm["host_rounds_missing"] = sum(HOSTS - len(x["heldout_by_host"]) for x in net["rounds"])
            per_seed[label] = arm
            print(f"seed {seed} {label}: final loss {arm['final_loss']:.4f} ({net['wall_s']:.0f} s); notes "
                  f"{[(x['round'], x['notes']) for x in net['rounds'] if x['notes']]}", file=sys.stderr)
        results["seeds"][str(seed)] = per_seed
    markdown = render(results, s)
    name = "fomoe_network_quick" if args.quick else "fomoe_network"
    write_result(RESULTS_DIR / f"{name}.json", results, before=before, markdown=markdown, indent=1)
    print(markdown)
    return 0


def render(results: dict[str, Any], s: Settings) -> str:
    seeds = list(results["seeds"])
    arms = ["simulation", *[label for label, _, _ in ARMS]]
    rows = []
    for arm in arms:
        runs = [results["seeds"][seed][arm] for seed in seeds]
        full = [results["seeds"][seed]["network r = 4 (full replica)"]["final_loss"] for seed in seeds]
        row = [arm, " / ".join(f"{r['final_loss']:.4f}" for r in runs),
               " / ".join(f"{r['final_loss'] - f:+.3f}" for r, f in zip(runs, full, strict=True))]
        if arm == "simulation":
            row += ["", "", "", "", ""]
        else:
            counted = [sum(x["update_bytes"] for x in r["rounds"]) for r in runs]
            formula_ok = all(all(x["update_bytes"] == r["formula_update_bytes"] for x in r["rounds"]) for r in runs)
            killed = "killed" in arm  # its survivors' counts cover three senders, the formula four, then three
            row += [f"{counted[0] / 1e6:.1f}", "(3 senders)" if killed else "yes" if formula_ok else "NO",
                    " / ".join(f"{sum(x['skip_fraction'] for x in r['rounds']) / len(r['rounds']):.3f}" for r in runs),
                    " / ".join(str(sorted({e for x in r["rounds"] for e in x["lost"]})) for r in runs),
                    " / ".join(f"{r['max_param_difference_vs_simulation']:.1e} / "
                               f"{r['max_heldout_difference_vs_simulation']:.1e}"
                               if "max_param_difference_vs_simulation" in r else "" for r in runs)]
        rows.append(row)
    headers = ["arm", f"swarm held-out loss (seeds {', '.join(seeds)})", "vs full replica", "update MB (seed "
               f"{seeds[0]})", "bytes = formula", "skip fraction", "experts lost",
               "max |param| / |loss| difference vs simulation"]
    curve_rows = []
    for arm in arms:
        r = results["seeds"][seeds[0]][arm]["rounds"]
        curve_rows.append([arm, *(f"{sum(x['heldout_by_host'].values()) / len(x['heldout_by_host']):.3f}"
                                  for x in r)])
    return "\n\n".join([
        f"{s.rounds} rounds of H = {s.inner_steps}, {HOSTS} hosts on contiguous quarters of builtin:pydoc, MoE "
        f"width {s.d_model}, {s.n_layers} blocks, {s.n_experts} experts top-{s.top_k}; unigram baseline "
        f"{results['unigram_loss']:.3f} nats/byte; the swarm's model on {s.final_eval_batches * 32} held-out windows.",
        markdown_table(headers, rows),
        f"Mean over hosts of each host's own held-out loss (its experts only) by round, seed {seeds[0]}:",
        markdown_table(["arm", *(f"round {t}" for t in range(s.rounds))], curve_rows)])


if __name__ == "__main__":
    sys.exit(main())

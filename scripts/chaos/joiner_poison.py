#!/usr/bin/env python3
"""Poisoned state for joiners and the W1 mix (issue 30, items 3 and 6) on a ``LocalNet``: gossip runs,
clean and with one learner holding a noise state from ``--poison_round`` on, W1 plain (the previous
default) and adaptive (the default): the honest held-out loss per round; then tenured Sybils at
round 0 and a tenured liar at "current + 1": the honest median targets and the state a joiner takes::

    .venv/bin/python scripts/chaos/joiner_poison.py [--peers 6] [--rounds 16] [--poison_round 4] [--clean_reps 1] [--clean_only]"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.kit.state_donor import StateDonor
from gossamer.peer.run.records import PeerRecord
from gossamer.peer.serving import donated_state, role_app
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.core import aggregate
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_server import HttpServer
from gossamer_harness.localnet import LocalNet
from gossamer_harness.report import load_average_text, machine, write_result

ROOT = Path(__file__).resolve().parents[2]
MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}
NOISE_SCALE = 3.0


def gossip_run(peers: int, rounds: int, clip_ratio: float) -> dict:
    return {"run": {"name": "poison", "protocol": "diloco", "heartbeat_s": 30.0},
            "model": MODEL,
            "hyper": {"rounds": rounds, "batch_size": 8, "eval_batches": 4, "min_learners": peers,
                      "w1_grace_s": 30.0, "w2_deadline_s": 30.0, "w1_clip_ratio": clip_ratio,
                      "diloco": {"inner_steps": 8, "inner_lr": 0.003},
                      "mixing": {"w1": "ring", "w2": "ring"}, "aggregator": {"name": "mean"}}}


class ClipCount:
    """How many adaptive W1 mixes clipped a neighbour: counted by wrapping ``aggregate.w1_radius``
    (the learners call it once per mix with two or more neighbours)."""

    def __init__(self) -> None:
        self.mixes = self.clipped = 0
        self.radius = aggregate.w1_radius

    def __call__(self, distances, *, ratio: float) -> float:
        tau = self.radius(distances, ratio=ratio)
        self.mixes += 1
        self.clipped += max(distances) > tau
        return tau


def noise_like(params: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(t.shape, generator=g).to(t.dtype) * NOISE_SCALE for name, t in params.items()}


async def mixing_arm(args: argparse.Namespace, workdir: Path, *, clip_ratio: float, poison: bool) -> dict:
    """One gossip run; with ``poison``, learner l0 adopts a noise state at the start of ``--poison_round``."""
    net = await LocalNet.create(gossip_run(args.peers, args.rounds, clip_ratio), plugins=PLUGINS, workdir=workdir)
    started = time.monotonic()
    count = aggregate.w1_radius = ClipCount()
    try:
        roles: list[LearnerRole] = [(await net.add(f"l{i}", ("learner",))).role for i in range(args.peers)]  # type: ignore[misc]
        if poison:
            noise = noise_like(flat_parameters(roles[0].replica.module), seed=30)

            def take_noise(name: str, event: str, fields: dict) -> None:
                """l0 takes a liar's noise state at the end of the round before ``--poison_round``."""
                if name == "l0" and event == "diloco.round" and int(fields["round"]) == args.poison_round - 1:
                    with torch.no_grad():
                        for key, p in roles[0].replica.module.named_parameters():
                            p.copy_(noise[key])

            net.watchers.append(take_noise)
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles)), timeout=1200)
    finally:
        aggregate.w1_radius = count.radius
        await net.aclose()
    honest = roles[1:] if poison else roles
    per_round = [statistics.fmean(r.history.get(t).heldout_loss for r in honest if r.history.get(t) is not None)
                 for t in range(args.rounds)]
    return {"clip_ratio": clip_ratio, "poison": poison, "wall_s": round(time.monotonic() - started, 1),
            "w1_mixes_adaptive": count.mixes, "w1_mixes_clipped": count.clipped,
            "honest_heldout_per_round": [round(x, 4) for x in per_round], "honest_heldout_end": round(per_round[-1], 4),
            "honest_heldout_last3": round(statistics.fmean(per_round[-3:]), 4),
            "honest_heldout_max_after_poison": round(max(per_round[args.poison_round:]), 4)}


def learner_record(identity: Identity, net: LocalNet, **changes) -> PeerRecord:
    record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="free", http_addr="",
                        tcp_addr="", roles=("learner",), version="x", round=0, timestamp=net.now())
    return dataclasses.replace(record, **changes)


async def tenured_attackers(args: argparse.Namespace, workdir: Path) -> dict:
    """Two honest learners, six tenured Sybils at round 0 and a tenured liar one round ahead."""
    tenure_s, rounds = 60.0, 2
    run = gossip_run(2, rounds, 2.0)
    run["run"]["tenure_s"] = tenure_s
    run["hyper"].update(catch_up_rounds=2, mixing={"w1": "global", "w2": "global"})
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=workdir)
    server = None
    try:
        honest: list[LearnerRole] = [(await net.add(f"l{i}", ("learner",))).role for i in range(2)]  # type: ignore[misc]
        await net.start()
        for role in honest:
            await role.drain()
        noise = noise_like(flat_parameters(honest[0].replica.module), seed=31)
        donor = StateDonor(lambda: (rounds + 1, noise))
        server = await HttpServer.create(role_app([], donor), host="127.0.0.1", port=0, config=HttpConfig())
        offer = {"round": rounds + 1, "http_addr": f"127.0.0.1:{server.address[1]}", "state": await donated_state(donor)}
        sybils = [Identity.generate() for _ in range(args.sybils + 1)]
        for _ in range(4):
            for sybil in sybils[:-1]:
                net.outsider(sybil, learner_record(sybil, net))
            net.outsider(sybils[-1], learner_record(sybils[-1], net, **offer))
            await net.publish()
            net.skip(tenure_s)
        for sybil in sybils[:-1]:
            net.outsider(sybil, learner_record(sybil, net))
        net.outsider(sybils[-1], learner_record(sybils[-1], net, **offer))
        await net.publish()
        targets = [role._out_of_step() for role in honest]
        joiner: LearnerRole = (await net.add("joiner", ("learner",))).role  # type: ignore[assignment]
        await net.start("joiner")
        await joiner.drain()
        reference = flat_parameters(honest[0].replica.module)
        adopted = flat_parameters(joiner.replica.module)
        same = all(torch.equal(reference[k], adopted[k]) for k in reference)
        return {"sybils": args.sybils, "sybil_presence_s": 4 * tenure_s, "tenure_s": tenure_s,
                "honest_median_targets": targets, "joiner_round": joiner.round, "honest_round": rounds,
                "joiner_state_is_the_honest_one": same,
                "joiner_heldout": joiner.history.values()[-1].heldout_loss if len(joiner.history) else None}
    finally:
        if server is not None:
            await server.aclose()
        await net.aclose()


async def main_async(args: argparse.Namespace) -> dict:
    arms = []
    with tempfile.TemporaryDirectory(prefix="gossamer-poison-") as tmp:
        cases = [(0.0, False), (2.0, False)] * args.clean_reps + ([] if args.clean_only else [(0.0, True), (2.0, True)])
        for k, (ratio, poison) in enumerate(cases):
            arm = await mixing_arm(args, Path(tmp) / f"arm{k}", clip_ratio=ratio, poison=poison)
            print(f"W1 clip_ratio {ratio} {'poisoned' if poison else 'clean   '}: honest held-out end "
                  f"{arm['honest_heldout_end']:.3f} (last 3 rounds {arm['honest_heldout_last3']:.3f}), worst after round {args.poison_round} "
                  f"{arm['honest_heldout_max_after_poison']:.3f}; W1 mixes clipped {arm['w1_mixes_clipped']} of "
                  f"{arm['w1_mixes_adaptive']} ({arm['wall_s']} s)", flush=True)
            arms.append(arm)
        if args.clean_only:
            return {"mixing": arms}
        attackers = await tenured_attackers(args, Path(tmp) / "tenured")
        print(f"tenured attackers: median targets {attackers['honest_median_targets']}, joiner at round "
              f"{attackers['joiner_round']}, honest state: {attackers['joiner_state_is_the_honest_one']}", flush=True)
    return {"mixing": arms, "tenured_attackers": attackers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--poison_round", type=int, default=4)
    parser.add_argument("--sybils", type=int, default=6)
    parser.add_argument("--clean_reps", type=int, default=1, help="clean runs of each W1 mix (the cost, and its noise)")
    parser.add_argument("--clean_only", action="store_true", help="only the clean runs")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/joiner_poison.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    before, load_before = machine(), load_average_text()
    data = asyncio.run(main_async(args))
    write_result(args.json, {**data, "load_before": load_before, "load_after": load_average_text()},
                 before=before, args=args)
    print(f"load before {load_before}, after {load_average_text()}")


if __name__ == "__main__":
    main()

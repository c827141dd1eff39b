"""Compressed context parallelism: ring attention with dense vs subspace-coded keys and values,
each step's messages replayed over emulated WAN links (docs/EXPERIMENTS.md)::

    nice -n 10 .venv/bin/python scripts/experiments/context.py [--quick] [--steps 140] [--arms dense,r2,r1,r2-m4,r1-m4]"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from _common import RESULTS_DIR, set_up
from _context_report import equal_time_losses, plot, render_tables
from _ring_links import RingLinks

from gossamer.protocols.context.core import (
    RingMember,
    SubspaceConfig,
    apply_update,
    build_context_model,
    encode_message,
    message_plan,
    orthonormality_error,
    reduce_gradients,
    run_ring,
    split_chunks,
)
from gossamer.protocols.context.core.subspace import basis_parameters
from gossamer.protocols.core.models import BatchSampler, ModelConfig, load_text, split_text
from gossamer_harness.report import machine, write_result
from gossamer_harness.wan import LinkProfile

MODEL = ModelConfig(d_model=128, n_layers=2, n_heads=4, context=2048)
CHUNKS = 4


@dataclass(frozen=True, kw_only=True)
class Settings:
    steps: int = 140  # optimizer steps per arm (~30 minutes for five arms on a shared 2-core CPU)
    batch_size: int = 2  # windows of 2048 bytes per step
    lr: float = 2e-3  # AdamW peak learning rate
    warmup_steps: int = 10  # linear warm-up, then cosine decay to 10% of the peak
    weight_decay: float = 0.1  # on weight matrices (not biases, norms or bases)
    eval_every: int = 10  # held-out loss every this many steps
    eval_windows: int = 8  # windows per held-out evaluation during training
    final_windows: int = 32  # windows of the final, paired evaluation
    mbit: float = 300.0  # emulated link rate per direction
    latency_ms: float = 50.0  # emulated one-way latency
    seed: int = 0  # model initialisation and batch order (the same in every arm)
    arms: tuple[str, ...] = ("dense", "r2", "r1", "r2-m4", "r1-m4")


QUICK = Settings(steps=4, batch_size=1, warmup_steps=1, eval_every=2, eval_windows=2, final_windows=4,
                 arms=("dense", "r2", "r1-m4"))


def subspace_of_label(label: str) -> SubspaceConfig:
    if label == "dense":
        return SubspaceConfig()
    rank, _, mixtures = label.removeprefix("r").partition("-m")
    return SubspaceConfig(rank=int(rank), mixtures=int(mixtures or 1))


@dataclass
class Arm:
    """One arm's model, optimizer, batch stream and what it measured."""

    label: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    sampler: BatchSampler
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)


def build_arm(label: str, settings: Settings, train: torch.Tensor, device: torch.device) -> Arm:
    model = build_context_model(MODEL, subspace_of_label(label), seed=settings.seed, device=device)
    bases = {id(p) for _, p in basis_parameters(model)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in bases]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in bases]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=settings.lr)

    def factor(step: int) -> float:
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0)))

    generator = torch.Generator().manual_seed(settings.seed)
    sampler = BatchSampler(train, batch_size=settings.batch_size, context=MODEL.context, generator=generator)
    return Arm(label, model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor), sampler)


def train_step(arm: Arm, step: int, device: torch.device) -> tuple[dict[str, Any], dict]:
    """One real ring step and update; the step's record and its frames keyed as ``message_plan`` keys them."""
    tokens, targets = arm.sampler.sample(device)
    members = [RingMember(arm.model, index=i, chunks=CHUNKS, step=step, tokens=x, targets=y)
               for i, (x, y) in enumerate(split_chunks(tokens, targets, CHUNKS))]
    trace = run_ring(members, clock=time.perf_counter)
    grads = reduce_gradients([m.gradients() for m in members])
    apply_update(arm.model, arm.optimizer, grads, grad_clip=1.0)
    arm.schedule.step()
    mixtures = members[0].spec.mixtures
    frames = {(s.source, s.target, s.message.key): encode_message(s.message, mixtures=mixtures) for s in trace.sent}
    sent: dict[str, int] = {"kv": 0, "dkv": 0}
    for (_, _, key), (_, payload) in frames.items():
        sent[key[0]] += sum(part.nbytes for part in payload)
    record = {"step": step, "loss": float(sum(m.loss for m in members)), "compute_s": max(trace.compute_s),
              "kv_bytes": sent["kv"], "dkv_bytes": sent["dkv"], "orthonormality_error": orthonormality_error(arm.model)}
    return record, frames


@torch.no_grad()
def window_losses(model: torch.nn.Module, heldout: torch.Tensor, windows: int, device: torch.device) -> list[float]:
    """Mean next-byte loss of each of ``windows`` evenly spaced held-out windows (no RNG)."""
    last = heldout.numel() - MODEL.context - 1
    starts = [i * last // max(windows - 1, 1) for i in range(windows)]
    model.eval()
    losses = []
    for group in range(0, windows, 4):
        batch = torch.stack([heldout[s:s + MODEL.context + 1] for s in starts[group:group + 4]]).to(device).long()
        logits = model(batch[:, :-1])
        per_byte = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="none")
        losses += per_byte.view(batch.shape[0], -1).mean(dim=1).tolist()
    model.train()
    return losses


def unigram_nats(train: torch.Tensor, heldout: torch.Tensor) -> float:
    """The trivial baseline: held-out cross-entropy of the training bytes' frequencies (add-one)."""
    counts = torch.bincount(train.long(), minlength=256).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[heldout.long()].mean())


async def replay_worker(links: RingLinks, plan: list, queue: asyncio.Queue) -> None:
    while (item := await queue.get()) is not None:
        record, frames = item
        record["comm_wan_s"] = await links.replay(plan, frames, link="wan")
        record["comm_direct_s"] = await links.replay(plan, frames, link="direct")


async def run(settings: Settings, device: torch.device) -> dict[str, Any]:
    split = split_text(load_text("builtin:pydoc"))
    arms = [build_arm(label, settings, split.train, device) for label in settings.arms]
    profile = LinkProfile.from_mbit(settings.mbit, settings.latency_ms)
    links = await RingLinks.create(CHUNKS, profile)
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * len(arms))
    replays = asyncio.create_task(replay_worker(links, message_plan(CHUNKS, MODEL.n_layers), queue))
    started = time.perf_counter()
    try:
        for step in range(settings.steps + 1):
            if step % settings.eval_every == 0 or step == settings.steps:
                for arm in arms:
                    losses = await asyncio.to_thread(window_losses, arm.model, split.heldout, settings.eval_windows,
                                                     device)
                    arm.evals.append({"step": step, "loss": statistics.fmean(losses)})
                print(f"step {step}: " + ", ".join(f"{a.label} {a.evals[-1]['loss']:.3f}" for a in arms)
                      + f"  ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
            if step == settings.steps:
                break
            for arm in arms:
                record, frames = await asyncio.to_thread(train_step, arm, step, device)
                arm.steps.append(record)
                await queue.put((record, frames))
        await queue.put(None)
        await replays
    finally:
        replays.cancel()
        await links.aclose()
    final = {arm.label: await asyncio.to_thread(window_losses, arm.model, split.heldout, settings.final_windows,
                                                device) for arm in arms}
    return {"settings": asdict(settings), "model": MODEL.to_dict(), "chunks": CHUNKS,
            "unigram_nats": unigram_nats(split.train, split.heldout), "initial_nats": math.log(256),
            "arms": {arm.label: {"steps": arm.steps, "evals": arm.evals, "final_window_losses": final[arm.label]}
                     for arm in arms},
            "minutes": (time.perf_counter() - started) / 60}


def parse_args(argv: list[str] | None) -> tuple[Settings, str, bool]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 1-2 minute smoke run")
    parser.add_argument("--device", default="auto")
    for name, value in asdict(Settings()).items():
        kind = (lambda s: tuple(s.split(","))) if isinstance(value, tuple) else type(value)
        parser.add_argument(f"--{name}", type=kind, default=None)
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    overrides = {k: v for k, v in vars(args).items() if k in asdict(settings) and v is not None}
    return replace(settings, **overrides), args.device, args.quick


def main(argv: list[str] | None = None) -> None:
    settings, device_name, quick = parse_args(argv)
    before = machine()
    device = set_up(device_name)
    result = asyncio.run(run(settings, device))
    result["load_average"] = os.getloadavg()
    result["equal_time"] = equal_time_losses(result)
    name = "context" + (f"_seed{settings.seed}" if settings.seed else "") + ("_quick" if quick else "")
    markdown = render_tables(result)
    print(markdown)
    write_result(RESULTS_DIR / f"{name}.json", result, before=before, markdown=markdown, indent=1)
    plot(result, RESULTS_DIR / f"{name}.png")


if __name__ == "__main__":
    main()

"""What the context tests share: a small run, a LocalNet of cp-shards, and waiting on their ledgers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from gossamer.crypto.identity import Identity
from gossamer.protocols.context.core import (
    RingMember,
    apply_update,
    build_context_model,
    clip_shares,
    reduce_gradients,
    run_ring,
)
from gossamer.protocols.context.replica import RingData, build_optimizer
from gossamer.protocols.context.settings import ContextSettings
from gossamer.protocols.context.shard import CpShardRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

RUN: dict[str, Any] = {
    "run": {"name": "ring", "protocol": "context", "heartbeat_s": 5.0},
    "model": {"d_model": 16, "n_layers": 2, "n_heads": 2, "context": 32, "subspace": {"rank": 2}},
    "hyper": {"chunk_tokens": 8, "batch_size": 2, "steps": 3, "min_shards": 2, "step_timeout_s": 30.0,
              "plan_timeout_s": 30.0, "eval_batches": 1, "lr": 0.01},
}


def run_config(**hyper: Any) -> dict[str, Any]:
    return {**RUN, "hyper": {**RUN["hyper"], **hyper}}


def identities(count: int) -> list[Identity]:
    """``count`` identities in peer-id order (the first leads a ring of them)."""
    return sorted((Identity.generate() for _ in range(count)), key=lambda identity: identity.peer_id)


async def shards(tmp_path: Path, run: dict[str, Any], count: int) -> tuple[LocalNet, list[CpShardRole]]:
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=tmp_path)
    roles = [(await net.add(f"s{i}", ("cp-shard",), identity=identity)).role
             for i, identity in enumerate(identities(count))]
    return net, roles  # type: ignore[return-value]


async def drain(roles: list[CpShardRole], timeout_s: float = 120.0) -> None:
    await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles)), timeout=timeout_s)


def reference(settings: ContextSettings, *, chunks: int, steps: int) -> torch.nn.Module:
    """The same steps in one process: ``run_ring`` over every member, each share clipped as the
    leader clips it (``hyper.share_clip``), summed, one update."""
    data = RingData.load(settings.data_source, heldout_fraction=settings.heldout_fraction)
    model = build_context_model(settings.model, settings.subspace, seed=settings.seed)
    optimizer = build_optimizer(model, settings)
    for step in range(steps):
        members = []
        for index in range(chunks):
            tokens, targets = data.chunk(step=step, seed=settings.seed, batch_size=settings.batch_size, chunks=chunks,
                                         chunk_tokens=settings.chunk_tokens, index=index)
            members.append(RingMember(model, index=index, chunks=chunks, step=step, tokens=tokens, targets=targets))
        run_ring(members)
        shares, _ = clip_shares([{n: g.cpu() for n, g in m.gradients().items()} for m in members], settings.share_clip)
        grads = reduce_gradients(shares)
        apply_update(model, optimizer, grads, grad_clip=settings.grad_clip)
    return model

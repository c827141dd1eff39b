"""What the context tests share: a small run, a LocalNet of cp-shards, and waiting on their ledgers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gossamer.crypto.identity import Identity
from gossamer.peer.roles import PLUGINS
from gossamer.peer.roles.context.shard import CpShardRole
from gossamer.peer.testing.localnet import LocalNet

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

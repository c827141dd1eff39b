"""A Byzantine cp-shard, as a peer running modified code would be: ``turn_byzantine`` makes a shard
send its gradient share scaled (sign-flipped x20 by default) to the leader, the rest of the shard
honest; ``run_ring`` trains a ring of shards on a ``LocalNet`` and returns their roles."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gossamer.crypto.identity import Identity
from gossamer.protocols.context.shard import CpShardRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

SIGN_FLIP_X20 = -20.0


def turn_byzantine(role: CpShardRole, *, scale: float = SIGN_FLIP_X20) -> None:
    """From the next step on, ``role`` sends its honest gradient share times ``scale``."""
    runner = role.runner
    honest = runner._own_share

    def own_share(attempt: Any) -> dict[str, Any]:
        return {name: grad * scale for name, grad in honest(attempt).items()}

    runner._own_share = own_share  # type: ignore[method-assign]


async def run_ring(workdir: Path, run: Mapping[str, Any], identities: Sequence[Identity], *,
                   byzantine: Sequence[int] = (), scale: float = SIGN_FLIP_X20,
                   timeout_s: float = 600.0) -> list[CpShardRole]:
    """One shard per identity (the lowest peer id leads) until every one has run ``hyper.steps``;
    the shards at the ``byzantine`` indices (not 0: the leader is trusted) send ``scale`` x their
    share. Returns every shard's role."""
    if 0 in byzantine:
        raise ValueError("the leader is trusted with the step: make a member Byzantine, not shard 0")
    ordered = sorted(identities, key=lambda identity: identity.peer_id)
    net = await LocalNet.create(dict(run), plugins=PLUGINS, workdir=workdir)
    try:
        roles: list[CpShardRole] = [(await net.add(f"s{i}", ("cp-shard",), identity=identity)).role  # type: ignore[misc]
                                    for i, identity in enumerate(ordered)]
        for index in byzantine:
            turn_byzantine(roles[index], scale=scale)
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles)), timeout=timeout_s)
        return roles
    finally:
        await net.aclose()

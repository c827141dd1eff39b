"""A Byzantine FoMoE expert host, as a peer running modified code would be: ``turn_byzantine`` makes
a host's replica send its own update scaled (sign-flipped x20 by default) with pair counts claimed
for the experts it holds, the rest of the host (commits, mixing) honest; ``run_hosts`` runs hosts
on a ``LocalNet`` with fixed identities (so a clean and an attacked run train on the same shards)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gossamer.crypto.identity import Identity
from gossamer.protocols.fomoe.core import FomoeReplica, FomoeUpdate
from gossamer.protocols.fomoe.host import ExpertHostRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

SIGN_FLIP_X20 = -20.0


def turn_byzantine(replica: FomoeReplica, *, scale: float = SIGN_FLIP_X20, claim: int | None = None) -> None:
    """From the next round on, ``replica.end_inner`` returns its honest update times ``scale`` and,
    with ``claim``, says it ran ``claim`` pairs of every unit it holds (none of the others')."""
    honest = replica.end_inner

    def end_inner() -> FomoeUpdate:
        update = honest()
        tokens = update.tokens.clone()
        if claim is not None:
            tokens[:, sorted(replica.resident)] = claim
        return FomoeUpdate(update.sender, {name: t * scale for name, t in update.delta.items()}, tokens)

    replica.end_inner = end_inner  # type: ignore[method-assign]


def pairs_bound(role: ExpertHostRole) -> int:
    """The most pairs of one unit an honest host runs in a round: every token of every batch once."""
    s = role.settings
    return s.text.batch_size * s.model.context * s.diloco.inner_steps


async def run_hosts(workdir: Path, run: Mapping[str, Any], identities: Sequence[Identity], *,
                    byzantine: Mapping[int, Mapping[str, Any]] | None = None, pair_limits: bool = True,
                    timeout_s: float = 600.0) -> list[ExpertHostRole]:
    """One host per identity (``h0``, ``h1``, ...) until every honest one has run ``hyper.rounds``;
    ``byzantine`` maps a host's index to ``turn_byzantine``'s keywords (``claim="bound"``: the
    most pairs an honest host could have run). ``pair_limits=False`` drops the bound on pair counts
    from every host (the code before issue 30, for the chaos script's "before" curve). Returns every
    host's role, its history intact."""
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=workdir)
    try:
        roles: list[ExpertHostRole] = []
        for index, identity in enumerate(identities):
            roles.append((await net.add(f"h{index}", ("expert-host",), identity=identity)).role)  # type: ignore[arg-type]
        for index, attack in (byzantine or {}).items():
            options = dict(attack)
            if options.get("claim") == "bound":
                options["claim"] = pairs_bound(roles[index])
            turn_byzantine(roles[index].replica, **options)
        if not pair_limits:
            for role in roles:
                role.pair_limits = None
        await net.start()
        honest = [role for index, role in enumerate(roles) if index not in (byzantine or {})]
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in honest)), timeout=timeout_s)
        return roles
    finally:
        await net.aclose()

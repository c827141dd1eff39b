"""Several FoMoE peers in one process, as the network runs them: ``simulate_round`` (each peer's
inner phase, then its own ``mix_round`` and outer step; the method's plain rules, every peer
honest, unless given the network's ``robust_default``) and ``global_parameters`` (the swarm's model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gossamer.protocols.core.errors import ProtocolError
from gossamer.protocols.diloco.core.replica import Params
from gossamer.protocols.fomoe.core.placement import Placement
from gossamer.protocols.fomoe.core.replica import FomoeReplica, StepReport
from gossamer.protocols.fomoe.core.sync import (
    Aggregator,
    PairLimits,
    mix_round,
    plain_mean,
    token_weighted_mean,
    update_bytes,
)

BatchFn = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]
"""batch_fn(replica index, round, step) -> (x, y)."""


@dataclass(frozen=True)
class RoundReport:
    """One simulated round: every step's report per replica, and the bytes really moved."""

    steps: tuple[tuple[StepReport, ...], ...]
    up_bytes: int
    """Bytes of every update's tensors (what the peers sent)."""
    down_bytes: int
    """Bytes of the aggregates each peer applied (what the peers received)."""
    counts_bytes: int
    idle: tuple[tuple[int, int], ...]


def simulate_round(replicas: Sequence[FomoeReplica], placement: Placement, batch_fn: BatchFn, *,
                   dense_aggregator: Aggregator = plain_mean, expert_aggregator: Aggregator = token_weighted_mean,
                   limits: PairLimits | None = None) -> RoundReport:
    for replica in replicas:
        if tuple(sorted(replica.resident)) != placement.resident(replica.sender):
            raise ProtocolError(f"replica {replica.sender} holds {sorted(replica.resident)}, the placement "
                                f"says {placement.resident(replica.sender)}")
    steps, updates = [], []
    for index, replica in enumerate(replicas):
        replica.begin_round()
        round_index = replica.round
        steps.append(tuple(replica.inner_step(*batch_fn(index, round_index, step))
                           for step in range(replica.diloco.config.inner_steps)))
        updates.append(replica.end_inner())
    down, idle = 0, set()
    for replica in replicas:
        mixed = mix_round(updates, placement, replica.layout, experts=replica.resident,
                          dense_aggregator=dense_aggregator, expert_aggregator=expert_aggregator, limits=limits)
        replica.finish_round(mixed)
        down += update_bytes(mixed.dense) + sum(update_bytes(p) for p in mixed.experts.values())
        idle.update(mixed.idle)
    return RoundReport(tuple(steps), sum(update_bytes(u.delta) for u in updates), down,
                       sum(u.tokens.numel() * u.tokens.element_size() for u in updates), tuple(sorted(idle)))


def global_parameters(replicas: Sequence[FomoeReplica], placement: Placement) -> Params:
    """The swarm's whole model: dense from the first replica, each expert from its first holder."""
    by_sender = {r.sender: r for r in replicas}
    first = replicas[0]
    out = {name: p.detach().clone() for name, p in first.module.named_parameters() if name in first.layout.dense}
    for key, names in first.layout.units.items():
        holders = placement.holders[key[1]]
        if not holders or holders[0] not in by_sender:
            raise ProtocolError(f"global_parameters: expert {key[1]} has no holder among the replicas")
        own = dict(by_sender[holders[0]].module.named_parameters())
        out.update({name: own[name].detach().clone() for name in names})
    return out

"""A round's synchronisation as pure functions over the updates that arrived: ``mix_round`` (the
dense part over every peer, each unit over its holders, idle units kept) through the robust
default rules (``clip_to_median_norm``) or the plain ones, ``addressed_to`` and ``update_problem``
(what a recipient needs, what it refuses: ``PairLimits``), and the bytes a round moves.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gossamer.protocols.core import robust
from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.robust import AggregateResult, Contribution, Failure
from gossamer.protocols.core.robust.base import majority_numel, screen
from gossamer.protocols.diloco.core.replica import Params
from gossamer.protocols.fomoe.core.layout import ParamLayout
from gossamer.protocols.fomoe.core.model import ExpertKey
from gossamer.protocols.fomoe.core.placement import Placement

Aggregator = Callable[[Sequence[Contribution], Sequence[Failure]], AggregateResult]

plain_mean: Aggregator = robust.mean
"""DiLoCo's unweighted mean over every peer (trusts every member: an allowlist run's choice)."""
token_weighted_mean: Aggregator = functools.partial(robust.mean, trust_weights=True)
"""The holders' mean weighted by the pairs each claims to have run (trusts every holder)."""


def median_norm(contributions: Sequence[Contribution]) -> float | None:
    """The lower median of the finite L2 norms of the well-formed ``contributions`` (the smaller of
    two, the middle of three), or None when fewer than two have one. Fewer than half of the
    contributions can pull it below the honest ones' norms, and none can raise it above them."""
    return _lower_median(list(_norms(contributions).values()))


def _norms(contributions: Sequence[Contribution]) -> dict[int, float]:
    """Index -> finite L2 norm (float64) of each well-formed contribution (``robust``'s screen)."""
    try:
        kept, _ = screen(contributions, expected_numel=majority_numel(contributions))
    except (NotEnoughUpdates, InvalidSetting):
        return {}
    wanted = {id(c) for c in kept}
    norms = {i: float(torch.linalg.vector_norm(c.vector, dtype=torch.float64))
             for i, c in enumerate(contributions) if id(c) in wanted}
    return {i: norm for i, norm in norms.items() if math.isfinite(norm)}


def _lower_median(values: list[float]) -> float | None:
    return sorted(values)[(len(values) - 1) // 2] if len(values) >= 2 else None


def clip_to_median_norm(aggregator: Aggregator) -> Aggregator:
    """``aggregator`` over the contributions each scaled down to ``median_norm`` of them (claimed
    weights, and contributions that are malformed or not finite, passed on untouched: the rule
    refuses those). Whoever stands alone (two holders of an expert: neither outvotes the other)
    then moves the aggregate at most as far as the smaller honest update would, whatever it sends;
    a rule with a majority (the geometric median over three or more) also bounds its direction."""

    def clipped(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), **params: Any) -> AggregateResult:
        norms = _norms(arrived)
        radius = _lower_median(list(norms.values()))
        if radius is None:
            return aggregator(arrived, failures, **params)
        scaled = [Contribution(c.sender, c.vector * (radius / norms[i]), c.weight)
                  if norms.get(i, 0.0) > radius else c for i, c in enumerate(arrived)]
        return aggregator(scaled, failures, **params)

    return clipped


robust_default: Aggregator = clip_to_median_norm(robust.geometric_median)
"""The default rule for the dense part and every expert: each contribution clipped to the median
norm, then the geometric median (with two holders, their mean)."""


@dataclass(frozen=True)
class PairLimits:
    """The most (token, expert) pairs an honest host runs in one round: every token of its H
    batches once per unit, top_k per token and block. Larger counts are refused whole."""

    per_unit: int
    per_block: int

    @classmethod
    def of(cls, *, batch_size: int, context: int, inner_steps: int, top_k: int) -> PairLimits:
        per_unit = batch_size * context * inner_steps
        return cls(per_unit, per_unit * top_k)


@dataclass(frozen=True, eq=False)
class FomoeUpdate:
    """What one peer sends for a round."""

    sender: str
    delta: Params
    """Pseudo-gradients x - y of the dense parameters and of every unit the sender holds."""
    tokens: torch.Tensor
    """[n_layers, E] int64: (token, expert) pairs the sender ran per unit in the inner phase."""


def addressed_to(update: FomoeUpdate, recipient: str, placement: Placement, layout: ParamLayout) -> FomoeUpdate:
    """The part of ``update`` that ``recipient`` needs: the dense pseudo-gradient and the units
    of the experts both hold (holder-only sync), with the counts. ``mix_round`` accepts it."""
    shared = set(placement.resident(update.sender)) & set(placement.resident(recipient))
    names = set(layout.dense).union(*(layout.units[key] for key in layout.units_of(shared)))
    return FomoeUpdate(update.sender, {n: t for n, t in update.delta.items() if n in names}, update.tokens)


@dataclass(frozen=True, eq=False)
class MixedRound:
    """What one peer applies: aggregated pseudo-gradients, and who counted in each."""

    dense: Params
    experts: Mapping[ExpertKey, Params]
    """Aggregated pseudo-gradient of each requested unit that is not idle."""
    idle: tuple[ExpertKey, ...]
    """Requested units none of whose holders ran a pair (or none arrived): they keep their weights."""
    dense_result: AggregateResult
    expert_results: Mapping[ExpertKey, AggregateResult]
    rejected: tuple[Failure, ...]
    """Updates refused whole (unknown sender, names not matching the placement, bad counts)."""


def mix_round(updates: Sequence[FomoeUpdate], placement: Placement, layout: ParamLayout, *,
              experts: Collection[int] | None = None, failures: Sequence[Failure] = (),
              dense_aggregator: Aggregator = robust_default, expert_aggregator: Aggregator = robust_default,
              limits: PairLimits | None = None) -> MixedRound:
    """Aggregate the dense part over every update and each unit of ``experts`` (default: all)
    over its holders' updates. ``failures`` are the peers whose update did not arrive; an update
    claiming more pairs than ``limits`` is refused whole.

    Raises ``NotEnoughUpdates`` when no usable dense contribution is left (the round fails).
    """
    valid, rejected = _screen(updates, placement, layout, limits)
    missing = [*failures, *rejected]
    dense_in = [Contribution(u.sender, robust.flatten({n: u.delta[n] for n in layout.dense})) for u in valid]
    if not dense_in:
        raise NotEnoughUpdates(f"fomoe round {placement.round}: no usable update arrived ({list(missing)})")
    dense_result = dense_aggregator(dense_in, missing)
    like = {name: valid[0].delta[name] for name in layout.dense}
    mixed_experts: dict[ExpertKey, Params] = {}
    results: dict[ExpertKey, AggregateResult] = {}
    idle: list[ExpertKey] = []
    wanted = range(layout.n_experts) if experts is None else experts
    for key in layout.units_of(wanted):
        arrived, skipped = _unit_contributions(key, valid, placement, layout, missing)
        if not arrived:
            idle.append(key)
            continue
        results[key] = expert_aggregator(arrived, skipped)
        mixed_experts[key] = robust.unflatten(results[key].value,
                                              {n: _holder_delta(valid, arrived[0].sender)[n] for n in layout.units[key]})
    return MixedRound(robust.unflatten(dense_result.value, like), mixed_experts, tuple(idle), dense_result,
                      results, tuple(rejected))


def _holder_delta(valid: Sequence[FomoeUpdate], sender: str) -> Params:
    return next(u.delta for u in valid if u.sender == sender)


def _unit_contributions(key: ExpertKey, valid: Sequence[FomoeUpdate], placement: Placement, layout: ParamLayout,
                        missing: Sequence[Failure]) -> tuple[list[Contribution], list[Failure]]:
    block, expert = key
    holders = set(placement.holders[expert])
    arrived, skipped = [], [f for f in missing if f.sender in holders]
    for update in valid:
        if update.sender not in holders:
            continue
        ran = int(update.tokens[block, expert])
        if layout.units[key][0] not in update.delta:
            skipped.append(Failure(update.sender, f"sent nothing for expert {expert} in block {block}"))
        elif ran == 0:
            skipped.append(Failure(update.sender, f"ran no tokens of expert {expert} in block {block}"))
        else:
            vector = robust.flatten({n: update.delta[n] for n in layout.units[key]})
            arrived.append(Contribution(update.sender, vector, weight=float(ran)))
    return arrived, skipped


def _screen(updates: Sequence[FomoeUpdate], placement: Placement, layout: ParamLayout,
            limits: PairLimits | None) -> tuple[list[FomoeUpdate], list[Failure]]:
    """Updates whose sender, names, shapes and counts fit the placement; the rest with a reason."""
    valid, rejected = [], []
    for update in sorted(updates, key=lambda u: u.sender):
        problem = _problem(update, placement, layout, limits)
        if problem is None:
            valid.append(update)
        else:
            rejected.append(Failure(update.sender, problem))
    return valid, rejected


def update_problem(update: FomoeUpdate, placement: Placement, layout: ParamLayout,
                   limits: PairLimits | None = None) -> str | None:
    """Why ``mix_round`` would refuse ``update`` whole under ``placement`` and ``limits`` (None:
    it would not): a network peer checks each update when it arrives, before it says it counts."""
    return _problem(update, placement, layout, limits)


def _problem(update: FomoeUpdate, placement: Placement, layout: ParamLayout, limits: PairLimits | None) -> str | None:
    if update.sender not in placement.peers:
        return "sender is not in the placement"
    resident = placement.resident(update.sender)
    names = set(update.delta)
    missing = sorted(set(layout.dense) - names)
    if missing:
        return f"dense parameters missing: {missing[:4]}"
    for key in layout.units:
        unit = set(layout.units[key])
        if unit & names and (key[1] not in resident or not unit <= names):
            return f"parameters do not match the placement: expert {key[1]} in block {key[0]} " + (
                "is not held by the sender" if key[1] not in resident else "is incomplete")
    unknown = sorted(names - set(layout.size_bytes))
    if unknown:
        return f"unknown parameters: {unknown[:4]}"
    for name, tensor in update.delta.items():
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != layout.shapes[name]:
            return f"parameter {name}: not a tensor of shape {layout.shapes[name]}"
    tokens = update.tokens
    shape = (layout.n_layers, layout.n_experts)
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int64 or tuple(tokens.shape) != shape:
        return f"tokens: expected an int64 tensor of shape {shape}"
    if bool((tokens < 0).any()):
        return "tokens: negative counts"
    held = torch.zeros(layout.n_experts, dtype=torch.bool)
    held[list(resident)] = True
    if bool(tokens[:, ~held].any()):
        return "tokens: counts for experts the sender does not hold"
    if limits is not None:
        if int(tokens.max()) > limits.per_unit:
            return (f"tokens: {int(tokens.max())} pairs claimed for one expert, more than the {limits.per_unit} "
                    f"tokens of a round (batch_size x context x inner_steps)")
        if int(tokens.sum(dim=1).max()) > limits.per_block:
            return (f"tokens: {int(tokens.sum(dim=1).max())} pairs claimed in one block, more than the "
                    f"{limits.per_block} a round routes (batch_size x context x inner_steps x top_k)")
    return None


@dataclass(frozen=True)
class SyncBytes:
    """Bytes one synchronisation moves over all peers (parameters in their own dtype)."""

    up_bytes: int
    """W |dense| + sum_e r_e |expert e|: every peer's pseudo-gradients."""
    down_bytes: int
    """The aggregates each peer receives: as up, less r_e |unit| for every idle unit."""
    counts_bytes: int
    """The routing counts sent with the pseudo-gradients (W x n_layers x E x 8)."""

    @property
    def total_bytes(self) -> int:
        return self.up_bytes + self.down_bytes + self.counts_bytes


def sync_bytes(layout: ParamLayout, placement: Placement, *, idle: Collection[ExpertKey] = ()) -> SyncBytes:
    """The exact traffic of one FoMoE synchronisation under ``placement``."""
    replication = placement.replications()
    experts = sum(r * layout.expert_bytes(e) for e, r in enumerate(replication))
    up = len(placement.peers) * layout.dense_bytes + experts
    down = up - sum(replication[e] * layout.unit_bytes((b, e)) for b, e in set(idle))
    return SyncBytes(up, down, len(placement.peers) * layout.n_layers * layout.n_experts * 8)


def all_to_all_bytes(layout: ParamLayout, placement: Placement) -> SyncBytes:
    """The same accounting when there is no aggregator and every peer sends its update straight to
    every other peer, cut to what both hold (``addressed_to``; the network's expert hosts do
    this): W (W - 1) |dense| + sum_e r_e (r_e - 1) |expert e| up, as much down (every message sent
    is received), and the counts with each of the W (W - 1) messages. Up to W - 1 times the
    aggregator's dense traffic, with no peer that sees every update."""
    w = len(placement.peers)
    experts = sum(r * (r - 1) * layout.expert_bytes(e) for e, r in enumerate(placement.replications()))
    up = w * (w - 1) * layout.dense_bytes + experts
    return SyncBytes(up, up, w * (w - 1) * layout.n_layers * layout.n_experts * 8)


def data_parallel_bytes(layout: ParamLayout, *, num_peers: int, steps: int) -> SyncBytes:
    """The same accounting for synchronous data parallel over ``steps`` steps: every peer sends
    its full gradient and receives the mean at every step."""
    per_step = num_peers * layout.total_bytes
    return SyncBytes(steps * per_step, steps * per_step, 0)


def update_bytes(params: Mapping[str, torch.Tensor]) -> int:
    """Bytes of the tensors in ``params`` (what sending them moves, without framing)."""
    return sum(t.numel() * t.element_size() for t in params.values())

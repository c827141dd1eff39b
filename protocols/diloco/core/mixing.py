"""Gossip topologies and the factored update of gossip DiLoCo. Peers of a round are indices 0..n-1
(sorted peer ids); a topology is a row-stochastic n x n float64 matrix W, and ``mix`` takes row i
over what arrived, renormalised, never waiting. ``MixingPlan`` names W1, W2, the W2 subset and the
exact averages; ``simulate_round`` runs one outer round of several replicas as the network does.
README.md, "The method", says why the update is factored this way."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates, ProtocolError
from gossamer.protocols.core.settings import check, setting
from gossamer.protocols.diloco.core.replica import DilocoReplica, Params

KINDS = ("global", "ring", "random_k", "none")


def mixing_weights(kind: str, n: int, *, round: int, seed: int, k: int = 2) -> torch.Tensor:
    """The n x n float64 row-stochastic mixing matrix of topology ``kind`` for ``round``."""
    if kind not in KINDS:
        raise InvalidSetting(f"topology must be one of {KINDS}, got {kind!r}")
    for name, value, low in (("n", n, 1), ("k", k, 1), ("round", round, 0), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidSetting(f"{name} must be an int >= {low}, got {value!r}")
    if kind == "global":
        return torch.full((n, n), 1.0 / n, dtype=torch.float64)
    if kind == "none":
        return torch.eye(n, dtype=torch.float64)
    if kind == "ring":
        return _ring(n)
    return _metropolis(_random_graph(n, k, np.random.default_rng([seed, round])))


def _ring(n: int) -> torch.Tensor:
    if n <= 2:
        return torch.full((n, n), 1.0 / n, dtype=torch.float64)
    w = torch.zeros((n, n), dtype=torch.float64)
    idx = torch.arange(n)
    for shift in (-1, 0, 1):
        w[idx, (idx + shift) % n] = 1.0 / 3.0
    return w


def _random_graph(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Symmetric adjacency, degree <= k: the union of k // 2 random Hamiltonian cycles, plus one
    random matching when k is odd. Connected for k >= 2."""
    adj = np.zeros((n, n), dtype=bool)
    for _ in range(k // 2):
        perm = rng.permutation(n)
        adj[perm, np.roll(perm, -1)] = True
    if k % 2:
        perm = rng.permutation(n)
        adj[perm[0 : n - 1 : 2], perm[1:n:2]] = True
    adj |= adj.T
    np.fill_diagonal(adj, False)
    return adj


def _metropolis(adj: np.ndarray) -> torch.Tensor:
    """W_ij = 1 / (1 + max(deg_i, deg_j)) on edges, the rest on the diagonal: doubly stochastic."""
    deg = adj.sum(axis=1)
    w = np.where(adj, 1.0 / (1.0 + np.maximum(deg[:, None], deg[None, :])), 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return torch.from_numpy(w)


def neighbours(weights_row: torch.Tensor) -> list[int]:
    """Indices with a nonzero weight in one row of W (the peer itself included)."""
    return [int(j) for j in torch.nonzero(weights_row > 0).flatten().tolist()]


Subset = tuple[str, ...] | Callable[[str], bool] | str


@dataclass(frozen=True, kw_only=True)
class MixingPlan:
    """Which topologies mix parameters (W1) and pseudo-gradients (W2), and what W2 covers."""

    w1: str = setting("global", choices=KINDS, doc="topology of the non-blocking parameter mix")
    w2: str = setting("global", choices=KINDS, doc="topology of the blocking pseudo-gradient mix")
    w2_subset: Subset = setting("all", doc='parameters W2 covers: "all", or name prefixes (dotted: "blocks.0" '
                                           'covers "blocks.0.attn.w", not "blocks.01.w"), or (in code) a predicate '
                                           "on the name; the rest use the learner's own pseudo-gradient")
    k: int = setting(2, low=1, doc="degree of the random_k topology")
    mix_momentum: bool = setting(False, doc="W1 also mixes the outer momentum of the round's start (sent beside "
                                            "the parameters, same neighbours and weights); false keeps it private")
    average_every: int = setting(0, low=0, doc="every average_every-th round is an exact average: W1 and W2 global "
                                               "over every parameter, momentum included; 0: never")

    def __post_init__(self) -> None:
        check(self)
        subset = self.w2_subset
        if isinstance(subset, tuple) and not all(subset):
            raise InvalidSetting(f"w2_subset prefixes must be non-empty strings, got {subset!r}")
        if isinstance(subset, str) and subset != "all":
            raise InvalidSetting(f'w2_subset must be "all", a list of prefixes or a predicate, got {subset!r}')

    def exact_round(self, round: int) -> bool:
        """Whether ``round`` is one of the periodic exact averages."""
        return self.average_every > 0 and (round + 1) % self.average_every == 0

    def mixes_momentum(self, round: int) -> bool:
        """Whether Mix1 of ``round`` carries the outer momentum."""
        return self.mix_momentum or self.exact_round(round)

    def covers(self, name: str, *, round: int | None = None) -> bool:
        """Whether W2 mixes the parameter ``name`` (in ``round``: an exact round mixes all)."""
        subset = self.w2_subset
        if isinstance(subset, str) or (round is not None and self.exact_round(round)):
            return True
        if callable(subset):
            return bool(subset(name))
        return any(name == p or name.startswith(p + ".") for p in subset)

    def w2_names(self, names: Iterable[str], *, round: int | None = None) -> list[str]:
        return [name for name in names if self.covers(name, round=round)]

    def w1_weights(self, n: int, *, round: int, seed: int) -> torch.Tensor:
        kind = "global" if self.exact_round(round) else self.w1
        return mixing_weights(kind, n, round=round, seed=2 * seed, k=self.k)

    def w2_weights(self, n: int, *, round: int, seed: int) -> torch.Tensor:
        """Drawn from a different seed than W1, so random graphs of W1 and W2 are independent."""
        kind = "global" if self.exact_round(round) else self.w2
        return mixing_weights(kind, n, round=round, seed=2 * seed + 1, k=self.k)


@dataclass(frozen=True)
class MixReport:
    """What one mix used: indices that counted, indices dropped (nonzero weight, did not arrive),
    and the renormalised weights of ``used`` (same order, summing to 1)."""

    used: tuple[int, ...]
    dropped: tuple[int, ...]
    weights: tuple[float, ...]


def mix(
    own: int,
    contributions: Mapping[int, Params],
    weights: torch.Tensor,
    *,
    names: Iterable[str] | None = None,
) -> tuple[Params, MixReport]:
    """Row ``own`` of ``weights`` over the contributions that arrived, renormalised to sum to 1.

    ``names`` restricts the mixed parameters; the others come back unchanged (the same tensors)
    from ``contributions[own]``. Results are accumulated in float32 on own's device and returned in
    own's dtype.

    Exactness, on which the DiLoCo bit-identity rests: (1) when every contribution to a parameter
    is bitwise equal, the result is that tensor exactly (any convex combination of one value is
    that value, but a float sum of n copies divided by n is not always); (2) when all used weights
    are equal, the result is the plain mean computed as ``sum in index order, then / count``, the
    same float operations a plain DiLoCo mean performs, rather than a sum of w_j * v_j.
    """
    report = _plan_row(own, contributions, weights)
    mine = contributions[own]
    mixed_names = list(mine) if names is None else list(names)
    out = dict(mine)
    equal = len(set(weights[own, report.used].tolist())) == 1
    with torch.no_grad():
        for name in mixed_names:
            tensors = [_lookup(contributions, j, name, mine) for j in report.used]
            out[name] = _combine(tensors, report.weights, equal, mine[name])
    return out, report


def _plan_row(own: int, contributions: Mapping[int, Params], weights: torch.Tensor) -> MixReport:
    n = weights.shape[0] if weights.dim() == 2 else -1
    if weights.dim() != 2 or weights.shape[1] != n:
        raise InvalidSetting(f"weights must be a square matrix, got shape {tuple(weights.shape)}")
    if not 0 <= own < n:
        raise InvalidSetting(f"own index {own} outside 0..{n - 1}")
    if own not in contributions:
        raise ProtocolError(f"own contribution {own} missing from the mix")
    row = weights[own].to(torch.float64)
    wanted = [j for j in range(n) if row[j] > 0]
    used = [j for j in wanted if j in contributions]
    dropped = [j for j in wanted if j not in contributions]
    total = float(row[used].sum()) if used else 0.0
    if total <= 0.0:
        raise NotEnoughUpdates(f"peer {own}: nothing with a nonzero weight arrived (dropped {dropped})")
    return MixReport(tuple(used), tuple(dropped), tuple(float(row[j]) / total for j in used))


def _lookup(contributions: Mapping[int, Params], j: int, name: str, mine: Params) -> torch.Tensor:
    tensor = contributions[j].get(name)
    if name not in mine:
        raise ProtocolError(f"parameter {name} is not among the own contribution's parameters")
    if tensor is None or tensor.shape != mine[name].shape:
        got = "nothing" if tensor is None else f"shape {tuple(tensor.shape)}"
        raise ProtocolError(f"contribution {j}: parameter {name} has {got}, expected {tuple(mine[name].shape)}")
    return tensor


def _combine(tensors: list[torch.Tensor], weights: tuple[float, ...], equal: bool, like: torch.Tensor) -> torch.Tensor:
    values = [t.to(device=like.device, dtype=torch.float32) for t in tensors]
    if all(torch.equal(values[0], v) for v in values[1:]):
        return values[0].to(like.dtype, copy=True)
    if equal:
        acc = values[0].clone()
        for v in values[1:]:
            acc += v
        acc /= len(values)
    else:
        acc = torch.zeros_like(values[0])
        for v, w in zip(values, weights, strict=True):
            acc.add_(v, alpha=w)
    return acc.to(like.dtype)


BatchesFn = Callable[[int, int, int], Any]
Trace = Callable[[str, Sequence[Params]], None]
"""Called by ``simulate_round`` with each stage's values of every replica, in order: ``x`` (the
round's start), ``u`` (the momentum the step starts from, before Mix1), ``m`` (after W1), ``u_mixed``
(after W1; own u when not mixed), ``d``, ``d_mixed`` (after W2), ``x_next``, ``u_next``."""


def simulate_round(
    replicas: Sequence[DilocoReplica],
    batches_fn: BatchesFn,
    plan: MixingPlan,
    *,
    round: int,
    seed: int,
    arrived_w1: set[int] | None = None,
    arrived_w2: set[int] | None = None,
    shared_momentum: bool = False,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    trace: Trace | None = None,
) -> list[float]:
    """One outer round of every replica, in one process, as the network runs it; returns each
    replica's mean inner loss.

    ``batches_fn(replica_index, round, step)`` gives one inner step's batch: ``(x, y)`` when
    ``loss_fn`` is given, else a callable ``compute_loss(module)``. ``arrived_w1`` / ``arrived_w2``
    are the indices whose snapshot (and momentum) / pseudo-gradient reach the others in time (None:
    all; a peer always has its own). ``shared_momentum`` is the ablation that also averages the
    outer momentum buffers globally after the outer step, so every replica starts the next round
    with the same u. ``trace`` sees every stage (see ``Trace``).
    """
    n, see = len(replicas), trace or (lambda _stage, _values: None)
    xs = [r.begin_round() for r in replicas]
    us = [r.momentum_snapshot() for r in replicas]
    w1 = plan.w1_weights(n, round=round, seed=seed)
    ms = [mix(i, _arrived(xs, arrived_w1, i), w1)[0] for i in range(n)]
    mixed_us = [mix(i, _arrived(us, arrived_w1, i), w1)[0] for i in range(n)] if plan.mixes_momentum(round) else None
    see("x", xs), see("u", us), see("m", ms), see("u_mixed", mixed_us or us)
    losses = [_inner_phase(r, i, round, batches_fn, loss_fn) for i, r in enumerate(replicas)]
    ds = [r.end_inner() for r in replicas]
    w2 = plan.w2_weights(n, round=round, seed=seed)
    names = plan.w2_names(ds[0], round=round)
    mixed = [mix(i, _arrived(ds, arrived_w2, i), w2, names=names)[0] for i in range(n)]
    see("d", ds), see("d_mixed", mixed)
    for i, replica in enumerate(replicas):
        replica.finish_round(ms[i], mixed[i], None if mixed_us is None else mixed_us[i])
    if shared_momentum:
        _average_momentum(replicas)
    see("x_next", [r.parameters_snapshot() for r in replicas])
    see("u_next", [r.outer.buffers(xs[i]) for i, r in enumerate(replicas)])
    return losses


def _arrived(values: Sequence[Params], arrived: set[int] | None, own: int) -> dict[int, Params]:
    return {j: v for j, v in enumerate(values) if arrived is None or j in arrived or j == own}


def _inner_phase(replica: DilocoReplica, index: int, round: int, batches_fn: BatchesFn, loss_fn: Any) -> float:
    total = 0.0
    steps = replica.config.inner_steps
    for step in range(steps):
        batch = batches_fn(index, round, step)
        total += replica.inner_step(*batch, loss_fn) if loss_fn is not None else replica.inner_step(batch)
    return total / steps


def _average_momentum(replicas: Sequence[DilocoReplica]) -> None:
    states = [r.outer.state_dict() for r in replicas]
    mean = {name: torch.stack([s[name] for s in states]).mean(0) for name in states[0]}
    for replica in replicas:
        replica.outer.load_state_dict({name: u.clone() for name, u in mean.items()})

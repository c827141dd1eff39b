"""Gossip topologies and the factored update of Gossip DiLoCo.

Peers of a round are indices 0..n-1 (the network maps sorted peer ids to indices). A topology is a
row-stochastic n x n float64 matrix W; peer i's mix is sum_j W_ij v_j over what arrived:

- ``global``    every entry 1/n (W1 = W2 = global is plain DiLoCo, bit for bit).
- ``ring``      self and the two ring neighbours, 1/3 each (n=1: [[1]]; n=2: 1/2 each).
- ``random_k``  a symmetric k-regular-ish graph re-drawn every round from (seed, round), with
                Metropolis-Hastings weights, so W is doubly stochastic.
- ``none``      the identity (no mixing).

A ``MixingPlan`` names the topology of the non-blocking parameter mix (W1) and of the blocking
pseudo-gradient mix (W2), and which parameters W2 covers. ``mix`` never waits: contributions that
did not arrive are dropped and the row renormalised. ``simulate_round`` runs one outer round of
several replicas in one process exactly as the network does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from gossamer.protocols.diloco import DilocoReplica, Params
from gossamer.protocols.errors import InvalidSetting, NotEnoughUpdates, ProtocolError

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

    w1: str = "global"
    """Topology of the non-blocking parameter mix."""
    w2: str = "global"
    """Topology of the blocking pseudo-gradient mix."""
    w2_subset: Subset = "all"
    """Parameters W2 covers: "all", name prefixes (dotted: "blocks.0" covers "blocks.0.attn.w" but
    not "blocks.01.w"), or a predicate on the name. The rest use the peer's own pseudo-gradient."""
    k: int = 2
    """Degree of the ``random_k`` topology."""

    def __post_init__(self) -> None:
        for name in ("w1", "w2"):
            if getattr(self, name) not in KINDS:
                raise InvalidSetting(f"{name} must be one of {KINDS}, got {getattr(self, name)!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InvalidSetting(f"k must be an int >= 1, got {self.k!r}")
        subset = self.w2_subset
        if isinstance(subset, list | tuple):
            if not all(isinstance(p, str) and p for p in subset):
                raise InvalidSetting(f"w2_subset prefixes must be non-empty strings, got {subset!r}")
            object.__setattr__(self, "w2_subset", tuple(subset))
        elif not (subset == "all" or callable(subset)):
            raise InvalidSetting(f'w2_subset must be "all", a list of prefixes or a predicate, got {subset!r}')

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MixingPlan:
        """Build from a manifest table; unknown keys are refused with InvalidSetting."""
        unknown = sorted(set(d) - cls.field_names())
        if unknown:
            raise InvalidSetting(f"unknown mixing settings: {unknown}")
        return cls(**dict(d))

    def covers(self, name: str) -> bool:
        """Whether W2 mixes the parameter ``name``."""
        subset = self.w2_subset
        if isinstance(subset, str):
            return True
        if callable(subset):
            return bool(subset(name))
        return any(name == p or name.startswith(p + ".") for p in subset)

    def w2_names(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if self.covers(name)]

    def w1_weights(self, n: int, *, round: int, seed: int) -> torch.Tensor:
        return mixing_weights(self.w1, n, round=round, seed=2 * seed, k=self.k)

    def w2_weights(self, n: int, *, round: int, seed: int) -> torch.Tensor:
        """Drawn from a different seed than W1, so random graphs of W1 and W2 are independent."""
        return mixing_weights(self.w2, n, round=round, seed=2 * seed + 1, k=self.k)


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
) -> list[float]:
    """One outer round of every replica, in one process, as the network runs it; returns each
    replica's mean inner loss.

    ``batches_fn(replica_index, round, step)`` gives one inner step's batch: ``(x, y)`` when
    ``loss_fn`` is given, else a callable ``compute_loss(module)``. ``arrived_w1`` / ``arrived_w2``
    are the indices whose snapshot / pseudo-gradient reach the others in time (None: all; a peer
    always has its own). ``shared_momentum`` is the ablation that also averages the outer momentum
    buffers globally after the outer step, so every replica starts the next round with the same u
    (the design says: loss spikes).
    """
    n = len(replicas)
    xs = [r.begin_round() for r in replicas]
    w1 = plan.w1_weights(n, round=round, seed=seed)
    ms = [mix(i, _arrived(xs, arrived_w1, i), w1)[0] for i in range(n)]
    losses = [_inner_phase(r, i, round, batches_fn, loss_fn) for i, r in enumerate(replicas)]
    ds = [r.end_inner() for r in replicas]
    w2 = plan.w2_weights(n, round=round, seed=seed)
    mixed = [mix(i, _arrived(ds, arrived_w2, i), w2, names=plan.w2_names(ds[i]))[0] for i in range(n)]
    for replica, m, d in zip(replicas, ms, mixed, strict=True):
        replica.finish_round(m, d)
    if shared_momentum:
        _average_momentum(replicas)
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

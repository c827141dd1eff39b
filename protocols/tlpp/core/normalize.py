"""Input normalisation without pooling raw data: each node's per-channel counts and sums
(``channel_stats``), pooled into a mean and std per channel (``pool_stats``: exactly those of the
union of the nodes' samples, up to float64 round-off), applied on every host by the model's first
layer (``Normalize``: buffers only, which travel with the node-side weights)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gossamer.protocols.tlpp.core.errors import TraversalError

MIN_STD = 1e-6  # a channel whose values barely vary is left unscaled (std 1), not divided by ~0


@dataclass(frozen=True)
class ChannelStats:
    """One node's reduction of its samples: how many (``count``), and per channel the sum of the
    values and of their squares over samples and positions (float64 sums)."""

    count: int
    sums: tuple[float, ...]
    squares: tuple[float, ...]

    def to_json(self) -> dict[str, object]:
        return {"count": self.count, "sums": list(self.sums), "squares": list(self.squares)}


def channel_stats(x: Tensor) -> ChannelStats:
    """Per-channel count, sum and sum of squares of ``x`` ([N, C, H, W] or [N, F])."""
    if x.dim() not in (2, 4) or x.shape[0] < 1:
        raise TraversalError(f"channel_stats: need [N, C, H, W] or [N, F] with N >= 1, got {tuple(x.shape)}")
    values = x.detach().to(torch.float64).transpose(0, 1).reshape(x.shape[1], -1)
    return ChannelStats(count=int(x.shape[0]), sums=tuple(values.sum(dim=1).tolist()),
                        squares=tuple((values * values).sum(dim=1).tolist()))


def read_stats(value: object, *, channels: int, count: int | None = None) -> ChannelStats:
    """``ChannelStats`` from what a node published (``ChannelStats.to_json``); TraversalError when
    it is malformed, has the wrong number of channels, or disagrees with ``count``."""
    if not isinstance(value, Mapping) or set(value) != {"count", "sums", "squares"}:
        raise TraversalError(f"stats: need {{count, sums, squares}}, got {value!r:.120}")
    n, sums, squares = value["count"], value["sums"], value["squares"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or (count is not None and n != count):
        raise TraversalError(f"stats: count must be the node's {count or 'positive'} sample count, got {n!r}")
    for name, seq in (("sums", sums), ("squares", squares)):
        if not isinstance(seq, Sequence) or len(seq) != channels or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in seq):
            raise TraversalError(f"stats: {name} must be {channels} finite numbers, got {seq!r:.120}")
    if any(q < 0 for q in squares):
        raise TraversalError("stats: a sum of squares is negative")
    return ChannelStats(count=n, sums=tuple(map(float, sums)), squares=tuple(map(float, squares)))


def pool_stats(stats: Iterable[ChannelStats], *, positions: int = 1) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel over every node's samples; ``positions`` = values per sample and
    channel (H x W for images, 1 for tabular)."""
    stats = list(stats)
    if not stats:
        raise TraversalError("pool_stats: no node's statistics")
    if len({len(s.sums) for s in stats}) != 1:
        raise TraversalError("pool_stats: the nodes' statistics have different numbers of channels")
    total = sum(s.count for s in stats) * positions
    mean = [math.fsum(s.sums[c] for s in stats) / total for c in range(len(stats[0].sums))]
    var = [max(math.fsum(s.squares[c] for s in stats) / total - mean[c] ** 2, 0.0) for c in range(len(mean))]
    std = [math.sqrt(v) if math.sqrt(v) > MIN_STD else 1.0 for v in var]
    return tuple(mean), tuple(std)


class Normalize(nn.Module):
    """(x - mean) / std per channel ([N, C, H, W]) or per feature ([N, F]), from fixed buffers."""

    def __init__(self, input_shape: Sequence[int]) -> None:
        super().__init__()
        if len(input_shape) not in (1, 3):
            raise TraversalError(f"Normalize: need an input shape [F] or [C, H, W], got {list(input_shape)}")
        shape = (input_shape[0],) + (1, 1) * (len(input_shape) == 3)
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("std", torch.ones(shape))

    def set(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Load per-channel ``mean`` and ``std`` (std > 0) into the buffers."""
        if len(mean) != self.mean.shape[0] or len(std) != self.std.shape[0] or min(std) <= 0:
            raise TraversalError(f"Normalize: need {self.mean.shape[0]} means and as many positive stds, got "
                                 f"{list(mean)!r:.80} and {list(std)!r:.80}")
        with torch.no_grad():
            self.mean.copy_(torch.tensor(mean, dtype=torch.float64).reshape(self.mean.shape))
            self.std.copy_(torch.tensor(std, dtype=torch.float64).reshape(self.std.shape))

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

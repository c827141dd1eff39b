"""Input normalisation from the nodes' counts and sums: pooled statistics equal those of the union
of the nodes' data, malformed statistics are refused, and ``Normalize`` applies them per channel."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.tlpp.core import (
    ChannelStats,
    Normalize,
    TraversalError,
    channel_stats,
    pool_stats,
    read_stats,
)


def test_pooled_statistics_are_those_of_the_union_of_the_nodes_data() -> None:
    g = torch.Generator().manual_seed(0)
    parts = [torch.rand(n, 3, 5, 4, generator=g) * (k + 1) + k for k, n in enumerate((7, 1, 12))]
    union = torch.cat(parts).double()
    mean, std = pool_stats([channel_stats(p) for p in parts], positions=20)

    torch.testing.assert_close(torch.tensor(mean, dtype=torch.float64), union.mean(dim=(0, 2, 3)), rtol=0, atol=1e-9)
    torch.testing.assert_close(torch.tensor(std, dtype=torch.float64), union.std(dim=(0, 2, 3), unbiased=False),
                               rtol=0, atol=1e-9)
    tabular = [torch.rand(4, 6, generator=g), torch.rand(9, 6, generator=g)]
    mean, _ = pool_stats(channel_stats(t) for t in tabular)
    torch.testing.assert_close(torch.tensor(mean), torch.cat(tabular).mean(dim=0), rtol=0, atol=1e-6)


def test_a_constant_channel_is_left_unscaled_and_normalize_applies_per_channel() -> None:
    x = torch.stack([torch.full((4, 4), 2.0), torch.arange(16.0).reshape(4, 4)])[None].repeat(3, 1, 1, 1)
    mean, std = pool_stats([channel_stats(x)], positions=16)
    layer = Normalize((2, 4, 4))
    layer.set(mean, std)
    out = layer(x)

    assert std[0] == 1.0 and float(out[:, 0].abs().max()) == 0.0
    torch.testing.assert_close(out[:, 1].mean(), torch.tensor(0.0), rtol=0, atol=1e-6)
    torch.testing.assert_close(out[:, 1].std(unbiased=False), torch.tensor(1.0), rtol=0, atol=1e-5)
    assert set(layer.state_dict()) == {"mean", "std"} and not list(layer.parameters())


@pytest.mark.parametrize(("value", "problem"), [
    (None, "need"), ({"count": 3, "sums": [1.0]}, "need"), ({"count": 0, "sums": [1.0], "squares": [1.0]}, "count"),
    ({"count": 4, "sums": [1.0], "squares": [1.0]}, "count must be the node's 3"),
    ({"count": 3, "sums": [1.0, 2.0], "squares": [1.0]}, "sums must be 1 finite"),
    ({"count": 3, "sums": [float("nan")], "squares": [1.0]}, "sums must be 1 finite"),
    ({"count": 3, "sums": [1.0], "squares": [True]}, "squares must be 1 finite"),
    ({"count": 3, "sums": [1.0], "squares": [-1.0]}, "negative"),
])
def test_malformed_statistics_are_refused(value: object, problem: str) -> None:
    with pytest.raises(TraversalError, match=problem):
        read_stats(value, channels=1, count=3)


def test_statistics_round_trip_and_bad_inputs() -> None:
    stats = channel_stats(torch.ones(2, 3))
    assert read_stats(stats.to_json(), channels=3, count=2) == stats == ChannelStats(2, (2.0,) * 3, (2.0,) * 3)
    with pytest.raises(TraversalError):
        channel_stats(torch.ones(2, 3, 4))
    with pytest.raises(TraversalError):
        pool_stats([])
    with pytest.raises(TraversalError, match="positive stds"):
        Normalize((3,)).set([0.0] * 3, [1.0, 0.0, 1.0])

"""The next version of a block: the current one plus the mean of its workers' updates (checked
against a float64 sum), E moved by the mean difference over the number of blocks, and the
refusal of an empty list."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.blocktrain.core import mean_update, next_block, next_embedding


def tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=generator), "b": torch.randn(4, generator=generator)}


@pytest.mark.parametrize("count", [1, 2, 5])
def test_the_next_block_is_the_current_one_plus_the_mean_update(count: int) -> None:
    block, updates = tensors(0), [tensors(1 + i) for i in range(count)]

    got = next_block(block, updates)

    for name, value in block.items():
        reference = value.double() + sum(u[name].double() for u in updates) / count
        assert torch.allclose(got[name].double(), reference, atol=1e-6)
        assert got[name].dtype == torch.float32


def test_e_moves_by_the_mean_difference_over_the_number_of_blocks() -> None:
    embedding = {"weight": torch.zeros(2, 2)}
    differences = [{"weight": torch.full((2, 2), 1.0)}, {"weight": torch.full((2, 2), 3.0)}]

    assert torch.equal(next_embedding(embedding, differences, num_blocks=4)["weight"], torch.full((2, 2), 0.5))


def test_no_update_is_refused() -> None:
    with pytest.raises(ValueError, match="no updates"):
        mean_update([])

"""The next version of a block from the updates its workers trained against the current one: pure,
block_v + mean(updates) with the mean taken in sender order, so a recomputation from the same bytes
is bit-identical; an averaged E moves by mean(E differences) / num_blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Tensors = dict[str, torch.Tensor]


def mean_update(updates: Sequence[Mapping[str, torch.Tensor]]) -> Tensors:
    """The element-wise mean of ``updates`` (given in sender order), tensor by tensor."""
    if not updates:
        raise ValueError("mean_update: no updates")
    return {name: torch.stack([u[name] for u in updates]).mean(dim=0) for name in updates[0]}


def next_block(block: Mapping[str, torch.Tensor], updates: Sequence[Mapping[str, torch.Tensor]]) -> Tensors:
    """block_{v+1} = block_v + mean(updates)."""
    mean = mean_update(updates)
    return {name: block[name] + mean[name] for name in block}


def next_embedding(embedding: Mapping[str, torch.Tensor], differences: Sequence[Mapping[str, torch.Tensor]], *,
                   num_blocks: int) -> Tensors:
    """E after one block's version closed: E + mean(E differences) / num_blocks."""
    mean = mean_update(differences)
    return {name: value + mean[name] / num_blocks for name, value in embedding.items()}

"""What the BlockTrain protocol tests share: a tiny stack's config, seeded generators and tokens."""

from __future__ import annotations

import torch

from gossamer.protocols.blocktrain.core import BlockTrainConfig

TINY = BlockTrainConfig(d_model=16, n_heads=2, context=8, num_blocks=3)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tokens(seed: int, batch: int = 2, length: int = 8) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=gen(seed))

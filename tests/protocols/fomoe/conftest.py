"""Shared fixtures of the FoMoE protocol tests: one torch thread, a tiny MoE config."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gossamer.protocols.fomoe import MoEConfig

TINY = MoEConfig(d_model=32, n_layers=2, n_heads=4, context=16, mlp_ratio=2, n_experts=4, top_k=2)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one intra-op thread; on a busy 2-core host two threads thrash."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))

"""Shared parts of the FoMoE protocol tests: one torch thread, a tiny MoE config, token batches."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.fomoe.core import MoEConfig

TINY = MoEConfig(d_model=32, n_layers=2, n_heads=4, context=16, mlp_ratio=2, n_experts=4, top_k=2)


@pytest.fixture(autouse=True)
def _single_thread(one_thread: None) -> None:
    """Every FoMoE test runs on one intra-op thread (``one_thread`` in tests/protocols/conftest.py)."""


def tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))

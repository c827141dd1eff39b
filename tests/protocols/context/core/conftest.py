"""Small float64 models and batches shared by the context-parallel tests."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.context.core import SubspaceConfig, build_context_model
from gossamer.protocols.core.models import ModelConfig

TINY = ModelConfig(d_model=32, n_layers=2, n_heads=4, context=32)
CODINGS = [SubspaceConfig(), SubspaceConfig(rank=2), SubspaceConfig(rank=1), SubspaceConfig(rank=3, mixtures=3)]


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every context test runs on one intra-op thread (``tests/protocols/conftest.py``)."""


def tiny_model(subspace: SubspaceConfig, *, seed: int = 0, config: ModelConfig = TINY):
    return build_context_model(config, subspace, seed=seed, dtype=torch.float64)


def batch(*, size: int = 2, length: int = 32, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (size, length + 1), generator=generator)
    return data[:, :-1], data[:, 1:]

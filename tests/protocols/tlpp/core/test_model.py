"""The TL++ model and its split: no BatchNorm or dropout below the cut, the affine orchestrator side,
bad cuts refused, a seeded digits_cnn."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gossamer.protocols.core.errors import ProtocolError
from gossamer.protocols.tlpp.core import (
    TraversalError,
    affine_layer,
    check_node_side,
    digits_cnn,
    split_model,
)


def test_batchnorm_and_dropout_below_cut_refused() -> None:
    model = nn.Sequential(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)), nn.Sequential(nn.Flatten()))
    with pytest.raises(TraversalError, match="BatchNorm2d"):
        split_model(model, 1)
    with pytest.raises(TraversalError, match="Dropout"):
        check_node_side(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    check_node_side(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0), nn.LayerNorm(2)))
    above = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.BatchNorm1d(2)))
    split_model(above, 1)  # BatchNorm on the orchestrator side sees the whole batch: fine


@pytest.mark.parametrize(("cut", "found"), [(1, "Conv2d"), (2, "ReLU")])
def test_affine_layer_refuses_non_affine(cut: int, found: str) -> None:
    _, orchestrator_side = split_model(digits_cnn(), cut)
    with pytest.raises(TraversalError, match=f"one nn.Linear.*{found}"):
        affine_layer(orchestrator_side)


def test_affine_layer_returns_the_linear() -> None:
    model = digits_cnn()
    _, orchestrator_side = split_model(model, 3)
    assert affine_layer(orchestrator_side) is model[3][0]


@pytest.mark.parametrize("cut", [0, 4, 1.0, True])
def test_split_model_refuses_bad_cut(cut: object) -> None:
    with pytest.raises(TraversalError, match="cut"):
        split_model(digits_cnn(), cut)


def test_split_model_refuses_non_sequential() -> None:
    with pytest.raises(TraversalError, match=r"nn\.Sequential"):
        split_model(nn.Linear(2, 2), 1)


@pytest.mark.parametrize("kwargs", [{"channels": (16, 32)}, {"channels": (16, 0, 32)}, {"hidden": 0},
                                    {"num_classes": 1}, {"seed": -1}])
def test_digits_cnn_refuses_bad_shapes(kwargs: dict) -> None:
    with pytest.raises(TraversalError):
        digits_cnn(**kwargs)


def test_digits_cnn_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, b, c = digits_cnn(seed=4), digits_cnn(seed=4), digits_cnn(seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a[0][0].weight, c[0][0].weight)
    assert a(torch.rand(2, 1, 8, 8)).shape == (2, 10) and len(a) == 4


def test_traversal_error_is_a_protocol_error() -> None:
    assert issubclass(TraversalError, ProtocolError)

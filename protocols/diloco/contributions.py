"""What a learner's messages carry: a ``params`` message the model's parameters (and, in a round
that mixes it, their outer momentum under ``MOMENTUM``), a ``pgrad`` message the pseudo-gradient
on the round's W2 subset; and why a received one does not fit (names, shapes, dtypes, finite
parameters).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from gossamer.protocols.diloco.core.aggregate import PseudoGradientAggregator
from gossamer.protocols.diloco.core.mixing import MixingPlan

KINDS = ("params", "pgrad")
MOMENTUM = "outer_momentum/"
"""Prefix of the momentum tensors in a ``params`` message (no parameter name contains a slash)."""


def expected_tensors(kind: str, round: int, params: Mapping[str, torch.Tensor], *, mixing: MixingPlan,
                     aggregator: PseudoGradientAggregator) -> Mapping[str, torch.Tensor]:
    """What a message of ``kind`` for ``round`` carries, given the model's ``params``."""
    if kind == "params":
        momentum = mixing.mixes_momentum(round)
        return {**params, **({MOMENTUM + name: t for name, t in params.items()} if momentum else {})}
    return aggregator.subset_of(params, round=round)


def shape_problem(kind: str, expected: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``tensors`` do not fit what a ``kind`` message should carry; None when they do."""
    if tensors.keys() != expected.keys():
        return f"{kind} names do not match the model"
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape or tensor.dtype != expected[name].dtype:
            return f"{kind} tensor {name!r} has shape {tuple(tensor.shape)} {tensor.dtype}"
        if kind == "params" and not torch.isfinite(tensor).all():
            return f"params tensor {name!r} is not finite"
    return None

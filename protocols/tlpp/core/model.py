"""The model and its split at the cut: ``digits_cnn``, the node-side checks, ``split_model`` (both
sides share their modules with the model and keep its parameter names, ``"0.0.weight"``), and the
affine layer secure mode needs above the cut."""

from __future__ import annotations

import torch
from torch import nn

from gossamer.protocols.tlpp.core.builtins import digits_cnn_stages
from gossamer.protocols.tlpp.core.errors import TraversalError, check_count
from gossamer.protocols.tlpp.core.stages import Shape, build_stages


def digits_cnn(*, channels: tuple[int, int, int] = (16, 32, 32), hidden: int = 64, num_classes: int = 10,
               seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               input_shape: Shape = (1, 8, 8)) -> nn.Sequential:
    """The built-in ``digits_cnn`` (``builtins``), by default for 8x8 single-channel images (sklearn
    digits), input [N, 1, 8, 8].

    Stages 1-3: conv 3x3 (padding 1) + ReLU + 2x2 max-pool (8 -> 4 -> 2 -> 1); stage 3 then flattens
    and adds Linear(hidden) + ReLU; stage 4 is Linear(num_classes), the affine orchestrator side of cut 3.
    No BatchNorm, so every cut is exact. Weights are drawn from a generator seeded with ``seed``
    (``stages.init_weights``), never from the global RNG.
    """
    if len(channels) != 3:
        raise TraversalError(f"channels: need 3 conv widths, got {channels!r}")
    for i, width in enumerate(channels):
        check_count(f"channels[{i}]", width, low=1)
    check_count("hidden", hidden, low=1)
    stages = digits_cnn_stages(check_count("num_classes", num_classes, low=2), tuple(channels), hidden)
    return build_stages(stages, input_shape=input_shape, num_classes=num_classes, seed=seed, device=device,
                        dtype=dtype)


_STOCHASTIC = (nn.modules.dropout._DropoutNd,)


def check_node_side(node_side: nn.Module) -> None:
    """Refuse layers below the cut that break the exact summed gradient: BatchNorm (its statistics
    couple the samples of a batch, and a node sees only its slice) and dropout with p > 0 (the node
    recomputes its forward for the backward pass and would draw a different mask)."""
    for name, layer in node_side.named_modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            raise TraversalError(f"node side: {name or 'module'} is {type(layer).__name__}, which "
                                 "couples the samples of a batch; move the cut below it or use "
                                 "GroupNorm/LayerNorm")
        if isinstance(layer, _STOCHASTIC) and layer.p > 0:
            raise TraversalError(f"node side: {name or 'module'} is {type(layer).__name__}(p={layer.p}); "
                                 "a recomputed forward would draw a different mask")


def split_model(model: nn.Sequential, cut: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(node side, orchestrator side) = (stages [0, cut), stages [cut, end)). Both share their modules with
    ``model`` and keep its parameter names; the node side passes ``check_node_side``."""
    if not isinstance(model, nn.Sequential):
        raise TraversalError(f"model: need an nn.Sequential of stages, got {type(model).__name__}")
    if isinstance(cut, bool) or not isinstance(cut, int) or not 1 <= cut < len(model):
        raise TraversalError(f"cut: must be an int in [1, {len(model) - 1}] for {len(model)} stages, "
                             f"got {cut!r}")
    node_side, orchestrator_side = model[:cut], model[cut:]
    check_node_side(node_side)
    return node_side, orchestrator_side


def affine_layer(orchestrator_side: nn.Module) -> nn.Linear:
    """The orchestrator side's single ``nn.Linear`` (secure mode computes on shares only through an affine
    map). Anything else is refused: a non-linearity on shares would need an approximation or a
    protocol gossamer does not run, and silently approximating is not an option."""
    leaves = [(name, m) for name, m in orchestrator_side.named_modules()
              if not list(m.children()) and not isinstance(m, nn.Identity)]
    if len(leaves) == 1 and isinstance(leaves[0][1], nn.Linear):
        return leaves[0][1]
    found = ", ".join(f"{name}: {type(m).__name__}" for name, m in leaves) or "no layers"
    raise TraversalError(f"secure mode needs the orchestrator side (above the cut) to be one nn.Linear (an affine map on shares); "
                         f"found {found}; move the cut up to the last Linear")

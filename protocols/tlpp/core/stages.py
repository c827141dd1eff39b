"""Declared models: a stack of stages, each a list of layer specs (``"conv 16"``, ``"linear 64"``),
checked against the input shape without building anything (``infer_shapes``; every refusal names
the layer) and built from the run seed the same on every host (``build_stages``). Nothing in the
vocabulary couples a batch's samples or draws randomness in the forward pass, so every cut is
exact. The vocabulary is in ``protocols/tlpp/README.md``, "Models"."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from gossamer.protocols.tlpp.core.errors import TraversalError, check_count

Declaration = tuple[tuple[str, ...], ...]
Shape = tuple[int, ...]
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}
OPS = ("conv", "maxpool", "avgpool", "globalpool", "residual", "flatten", "linear", *ACTIVATIONS)
MAX_WIDTH = 1 << 16  # channels, features, kernel sizes: a bound a declaration cannot exceed
_OPTION = re.compile(r"^([a-z]+)=(\d+)$")
# op -> (positional arguments: required, optional; the options it takes)
_SIGNATURES: dict[str, tuple[int, int, tuple[str, ...]]] = {
    "conv": (1, 1, ("stride", "pad")), "maxpool": (1, 0, ()), "avgpool": (1, 0, ()), "globalpool": (0, 0, ()),
    "residual": (1, 0, ("stride",)), "flatten": (0, 0, ()), "linear": (1, 0, ()),
    **{name: (0, 0, ()) for name in ACTIVATIONS},
}


@dataclass(frozen=True)
class Layer:
    """One parsed layer spec: its operation, positional sizes and options, and where it was declared
    (``stages[i][j] 'spec'``, the prefix of every refusal about it)."""

    op: str
    args: tuple[int, ...]
    options: dict[str, int] = field(default_factory=dict)
    where: str = ""

    def option(self, name: str, default: int) -> int:
        return self.options.get(name, default)


def parse_layer(spec: object, where: str) -> Layer:
    """A layer spec string as a ``Layer``; TraversalError naming ``where`` and the vocabulary."""
    if not isinstance(spec, str) or not spec.split():
        raise TraversalError(f"{where}: a layer is a non-empty string such as 'conv 16', got {spec!r}")
    op, *tokens = spec.split()
    named = f"{where} {spec!r}"
    if op not in _SIGNATURES:
        raise TraversalError(f"{named}: unknown layer {op!r}; the vocabulary is {', '.join(OPS)}")
    required, optional, allowed = _SIGNATURES[op]
    args, options = [], {}
    for token in tokens:
        if match := _OPTION.match(token):
            if match[1] not in allowed:
                raise TraversalError(f"{named}: {op} takes no option {match[1]!r}"
                                     + (f" (it takes {', '.join(allowed)})" if allowed else ""))
            options[match[1]] = int(match[2])
        elif token.isdigit() and not options:
            args.append(int(token))
        else:
            raise TraversalError(f"{named}: cannot read {token!r}; sizes are integers, before key=value options")
    if not required <= len(args) <= required + optional:
        wanted = f"{required}" if not optional else f"{required} to {required + optional}"
        raise TraversalError(f"{named}: {op} takes {wanted} size(s), got {len(args)}")
    if any(not 1 <= a <= MAX_WIDTH for a in args) or any(
            not (0 if k == "pad" else 1) <= v <= MAX_WIDTH for k, v in options.items()):
        raise TraversalError(f"{named}: sizes must lie in [1, {MAX_WIDTH}] (pad in [0, {MAX_WIDTH}])")
    return Layer(op, tuple(args), options, named)


def parse_declaration(stages: object) -> list[list[Layer]]:
    """Every stage's parsed layers; TraversalError when the declaration is not a list of stages."""
    if not isinstance(stages, Sequence) or isinstance(stages, str) or len(stages) < 2:
        raise TraversalError(f"stages: need a list of at least 2 stages (the cut falls between two), got {stages!r:.80}")
    parsed = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, Sequence) or isinstance(stage, str) or not stage:
            raise TraversalError(f"stages[{i}]: a stage is a non-empty list of layers, got {stage!r:.80}")
        parsed.append([parse_layer(spec, f"stages[{i}][{j}]") for j, spec in enumerate(stage)])
    return parsed


def _image(layer: Layer, shape: Shape) -> Shape:
    if len(shape) != 3:
        raise TraversalError(f"{layer.where}: needs an image input [C, H, W], got {list(shape)}"
                             + ("; images enter as [C, H, W] (model.input_shape)" if len(shape) == 1 else ""))
    return shape


def _spatial(layer: Layer, size: int, kernel: int, stride: int, pad: int) -> int:
    out = (size + 2 * pad - kernel) // stride + 1
    if size + 2 * pad < kernel or out < 1:
        raise TraversalError(f"{layer.where}: kernel {kernel} does not fit an input of size {size} "
                             f"(padding {pad}); the input is too small for this stack")
    return out


def output_shape(layer: Layer, shape: Shape) -> Shape:
    """The per-sample shape after ``layer`` for a per-sample input ``shape``; TraversalError naming
    the layer when the input does not fit it."""
    op = layer.op
    if op in ACTIVATIONS:
        return shape
    if op == "flatten":
        if len(shape) < 2:
            raise TraversalError(f"{layer.where}: the input {list(shape)} is already flat")
        return (math.prod(shape),)
    if op == "linear":
        if len(shape) != 1:
            raise TraversalError(f"{layer.where}: needs a flat input [F], got {list(shape)}; put "
                                 "'flatten' (or 'globalpool') before it")
        return (layer.args[0],)
    channels, height, width = _image(layer, shape)
    if op == "globalpool":
        return (channels,)
    if op in ("maxpool", "avgpool"):
        k = layer.args[0]
        return channels, _spatial(layer, height, k, k, 0), _spatial(layer, width, k, k, 0)
    if op == "conv":
        k = layer.args[1] if len(layer.args) > 1 else 3
        stride, pad = layer.option("stride", 1), layer.option("pad", k // 2)
        return layer.args[0], _spatial(layer, height, k, stride, pad), _spatial(layer, width, k, stride, pad)
    stride = layer.option("stride", 1)  # residual
    return layer.args[0], _spatial(layer, height, 3, stride, 1), _spatial(layer, width, 3, stride, 1)


def check_input_shape(input_shape: object) -> Shape:
    """``input_shape`` as a tuple: [F] (tabular) or [C, H, W] (images), every size >= 1."""
    if not isinstance(input_shape, Sequence) or len(input_shape) not in (1, 3) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= MAX_WIDTH for s in input_shape):
        raise TraversalError(f"input_shape: need [F] (tabular) or [C, H, W] (images), sizes in [1, {MAX_WIDTH}], "
                             f"got {input_shape!r}")
    return tuple(input_shape)


def infer_shapes(stages: Declaration, *, input_shape: Shape, num_classes: int) -> list[Shape]:
    """The per-sample output shape of every stage; TraversalError naming the layer that does not
    fit, or the last stage when the stack does not end in ``[num_classes]`` logits."""
    shape = check_input_shape(input_shape)
    check_count("num_classes", num_classes, low=2)
    shapes = []
    for layers in parse_declaration(stages):
        for layer in layers:
            shape = output_shape(layer, shape)
        shapes.append(shape)
    if shapes[-1] != (num_classes,):
        raise TraversalError(f"stages[{len(shapes) - 1}]: the stack ends in {list(shapes[-1])}, not the "
                             f"[{num_classes}] logits of num_classes = {num_classes}; end with 'linear {num_classes}'")
    return shapes


def check_cut(stages: Declaration, cut: int) -> None:
    """TraversalError unless ``cut`` splits ``stages`` into two non-empty sides."""
    if isinstance(cut, bool) or not isinstance(cut, int) or not 1 <= cut < len(stages):
        raise TraversalError(f"cut: must be an int in [1, {len(stages) - 1}] for {len(stages)} stages, got {cut!r}")


def check_secure(stages: Declaration, cut: int) -> None:
    """Secure mode's rule: what runs on shares must be affine over the cut, and gossamer runs one
    affine map on shares: the stages from ``cut`` on must hold exactly one ``linear`` layer. The
    refusal names the first stage above the cut that breaks the rule."""
    check_cut(stages, cut)
    parsed = parse_declaration(stages)
    linears = 0
    for i in range(cut, len(parsed)):
        for layer in parsed[i]:
            linears += layer.op == "linear"
            if layer.op != "linear" or linears > 1:
                what = (f"'{layer.op}' is not affine" if layer.op != "linear" else
                        "it is a second 'linear' layer (secure mode runs one affine map on shares)")
                raise TraversalError(
                    f"stages[{i}] ({', '.join(map(repr, stages[i]))}) is above the cut ({cut}) and "
                    f"{what}; everything above the cut must be one 'linear' layer: move the cut up to the "
                    f"last stage and make it just 'linear N'")


class GlobalPool(nn.Module):
    """The mean over height and width: [N, C, H, W] -> [N, C]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class ResidualBlock(nn.Module):
    """relu(skip(x) + conv2(relu(conv1(x)))), no normalisation; ``conv2`` starts at zero."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Identity() if cin == cout and stride == 1 else nn.Conv2d(cin, cout, 1, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.skip(x) + self.conv2(torch.relu(self.conv1(x))))


def _module(layer: Layer, shape: Shape) -> nn.Module:
    op = layer.op
    if op in ACTIVATIONS:
        return ACTIVATIONS[op]()
    if op == "flatten":
        return nn.Flatten()
    if op == "linear":
        return nn.Linear(shape[0], layer.args[0])
    if op == "globalpool":
        return GlobalPool()
    if op == "maxpool":
        return nn.MaxPool2d(layer.args[0])
    if op == "avgpool":
        return nn.AvgPool2d(layer.args[0])
    if op == "conv":
        k = layer.args[1] if len(layer.args) > 1 else 3
        return nn.Conv2d(shape[0], layer.args[0], k, stride=layer.option("stride", 1), padding=layer.option("pad", k // 2))
    return ResidualBlock(shape[0], layer.args[0], layer.option("stride", 1))


def init_weights(model: nn.Module, generator: torch.Generator) -> None:
    """Every Conv2d and Linear (weight, then bias, in module order) uniform in +-1/sqrt(fan_in),
    drawn in float64 from ``generator``; a residual block's second conv is then set to zero."""
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, nn.Conv2d | nn.Linear):
                bound = 1.0 / math.sqrt(layer.weight[0].numel())
                for tensor in (layer.weight, layer.bias):
                    draw = torch.rand(tensor.shape, generator=generator, dtype=torch.float64)
                    tensor.copy_((2 * draw - 1) * bound)
        for layer in model.modules():
            if isinstance(layer, ResidualBlock):
                layer.conv2.weight.zero_()
                layer.conv2.bias.zero_()


def build_stages(stages: Declaration, *, input_shape: Shape, num_classes: int, seed: int = 0,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 first: nn.Module | None = None) -> nn.Sequential:
    """The declared stack as an ``nn.Sequential`` of stages (parameter names ``"<stage>.<layer>.*"``),
    checked by ``infer_shapes`` and initialised from ``seed`` (never the global RNG). ``first``, when
    given, is prepended to stage 0 (e.g. the input normalisation) and shifts its layer indices by one."""
    infer_shapes(stages, input_shape=input_shape, num_classes=num_classes)
    shape = tuple(input_shape)
    built = []
    with torch.device("meta"):
        for i, layers in enumerate(parse_declaration(stages)):
            modules = [first] if i == 0 and first is not None else []
            for layer in layers:
                modules.append(_module(layer, shape))
                shape = output_shape(layer, shape)
            built.append(nn.Sequential(*modules))
    buffers = {} if first is None else {k: v.clone() for k, v in first.state_dict().items()}
    model = nn.Sequential(*built).to_empty(device=device).to(dtype)
    if first is not None:
        model[0][0].load_state_dict(buffers)
    init_weights(model, torch.Generator().manual_seed(check_count("seed", seed, low=0)))
    return model

"""The built-in models, as declarations in the ``stages`` vocabulary (so a built-in is checked and
built exactly like a declared stack, and a run owner can copy one into a run config to change it).

Each takes the run's input shape and number of classes, and optional ``channels`` (conv widths)
and ``hidden`` (width of the hidden linear layers); empty / 0 means the built-in's defaults:

    digits_cnn    4 stages: three blocks conv C + relu + maxpool 2, the third then flatten,
                  linear H, relu; the output layer. Images [C, H, W] with H, W >= 8 (sklearn's
                  8x8 digits: 8 -> 4 -> 2 -> 1; Fashion-MNIST's 28x28: 28 -> 14 -> 7 -> 3).
                  channels (16, 32, 32), hidden 64.
    rgb_cnn       4 stages for 32x32 colour images: two blocks of two 3x3 convs + relu and a
                  maxpool 2 (32 -> 16 -> 8); flatten, linear H, relu; the output layer.
                  channels (32, 64), hidden 256.
    tabular_mlp   3 stages for feature vectors [F]: linear H + relu twice; the output layer.
                  hidden 64.
    resnet_small  4 stages of norm-free residual blocks: conv C1 + relu + residual C1;
                  residual C2 stride 2; residual C3 stride 2 + globalpool; the output layer.
                  channels (16, 32, 64).

In every built-in the last stage is the single output ``linear``: the cut below it (the
default) is the one secure mode can run.
"""

from __future__ import annotations

from collections.abc import Callable

from gossamer.protocols.tlpp.core.errors import TraversalError, check_count
from gossamer.protocols.tlpp.core.stages import Declaration


def _widths(name: str, channels: tuple[int, ...], default: tuple[int, ...]) -> tuple[int, ...]:
    if not channels:
        return default
    if len(channels) != len(default):
        raise TraversalError(f"channels: {name} takes {len(default)} conv widths, got {list(channels)}")
    for i, width in enumerate(channels):
        check_count(f"channels[{i}]", width, low=1)
    return channels


def _hidden(hidden: int, default: int) -> int:
    return default if hidden == 0 else check_count("hidden", hidden, low=1)


def digits_cnn_stages(num_classes: int, channels: tuple[int, ...] = (), hidden: int = 0) -> Declaration:
    c1, c2, c3 = _widths("digits_cnn", channels, (16, 32, 32))
    h = _hidden(hidden, 64)
    return ((f"conv {c1}", "relu", "maxpool 2"), (f"conv {c2}", "relu", "maxpool 2"),
            (f"conv {c3}", "relu", "maxpool 2", "flatten", f"linear {h}", "relu"), (f"linear {num_classes}",))


def rgb_cnn_stages(num_classes: int, channels: tuple[int, ...] = (), hidden: int = 0) -> Declaration:
    c1, c2 = _widths("rgb_cnn", channels, (32, 64))
    h = _hidden(hidden, 256)
    return ((f"conv {c1}", "relu", f"conv {c1}", "relu", "maxpool 2"),
            (f"conv {c2}", "relu", f"conv {c2}", "relu", "maxpool 2"),
            ("flatten", f"linear {h}", "relu"), (f"linear {num_classes}",))


def tabular_mlp_stages(num_classes: int, channels: tuple[int, ...] = (), hidden: int = 0) -> Declaration:
    if channels:
        raise TraversalError(f"channels: tabular_mlp has no conv layers, got {list(channels)}")
    h = _hidden(hidden, 64)
    return ((f"linear {h}", "relu"), (f"linear {h}", "relu"), (f"linear {num_classes}",))


def resnet_small_stages(num_classes: int, channels: tuple[int, ...] = (), hidden: int = 0) -> Declaration:
    c1, c2, c3 = _widths("resnet_small", channels, (16, 32, 64))
    if hidden:
        raise TraversalError(f"hidden: resnet_small has no hidden linear layer, got {hidden}")
    return ((f"conv {c1}", "relu", f"residual {c1}"), (f"residual {c2} stride=2",),
            (f"residual {c3} stride=2", "globalpool"), (f"linear {num_classes}",))


BUILTINS: dict[str, Callable[..., Declaration]] = {
    "digits_cnn": digits_cnn_stages,
    "rgb_cnn": rgb_cnn_stages,
    "tabular_mlp": tabular_mlp_stages,
    "resnet_small": resnet_small_stages,
}


def builtin_stages(name: str, *, num_classes: int, channels: tuple[int, ...] = (), hidden: int = 0) -> Declaration:
    """The declaration of built-in ``name``; TraversalError for an unknown name or bad widths (the
    input shape is checked where every declaration is: ``stages.infer_shapes``)."""
    if name not in BUILTINS:
        raise TraversalError(f"name: unknown built-in model {name!r}; the built-ins are {', '.join(BUILTINS)}")
    check_count("num_classes", num_classes, low=2)
    return BUILTINS[name](num_classes, tuple(channels), hidden)

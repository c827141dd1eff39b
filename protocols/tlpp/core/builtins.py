"""The built-in models (``BUILTINS``) as declarations in the ``stages`` vocabulary, so a built-in is
checked and built exactly like a declared stack. In each the last stage is the single output
``linear``: the default cut, below it, is the one secure mode can run. The list of built-ins and
their sizes is in ``protocols/tlpp/README.md``, "Models"."""

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

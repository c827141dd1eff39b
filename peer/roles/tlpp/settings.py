"""A TL++ run's settings, read from its signed manifest (``run.protocol = "tlpp"``).

Manifest layout (run config TOML)::

    [model]   name = "digits_cnn" (the only model so far: 4 stages, ``protocols.tlpp``),
              cut (stages [0, cut) run on the data nodes, [cut, 4) on the servers; 1..3),
              channels = [c1, c2, c3], hidden
    [data]    test (the held-out split the orchestrator evaluates on; default
              "builtin:digits:test"), test_fraction and split_seed (the stratified train/test
              split of the built-in digits, the same on every host), num_shards (a node started
              without ``--data`` takes shard ``peer id mod num_shards`` of the training split)
    [hyper]   mode = "base" | "secure" (secure: cut activations and gradients travel as additive
              shares to the orchestrator and the helper; needs cut = 3, an affine server side),
              batch_size (virtual batch), optimizer = "adam" | "sgd", lr, momentum (sgd),
              weight_decay, steps (optimizer steps; 0: ``epochs`` passes over the nodes' data),
              epochs, seed (model initialisation and the epochs' shuffles), drop_last,
              max_abs (secure: the bound on |cut activation| a node enforces before sharing,
              the premise of the truncation guard), max_failure (secure: the truncation failure
              bound per virtual batch the guard allows), min_nodes (training starts once this
              many nodes are live), node_timeout_s (deadline of one request to a node),
              helper_timeout_s (deadline of one request to the helper; also how long a node
              waits to see the named helper), helper_wait_s (how long the helper waits for the
              nodes' shares a request names), eval_every (steps between evaluations on the
              held-out split; 0: only at the end)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.tlpp import TraversalError, digits_cnn, split_model

MODELS = ("digits_cnn",)
MODES = ("base", "secure")
OPTIMIZERS = ("adam", "sgd")
NUM_STAGES = 4
NUM_CLASSES = 10

_MODEL_KEYS: dict[str, Any] = {"name": "digits_cnn", "cut": 3, "channels": [16, 32, 32], "hidden": 64}
_DATA_KEYS: dict[str, Any] = {"test": "builtin:digits:test", "test_fraction": 0.2, "split_seed": 0,
                              "num_shards": 4}
_HYPER_KEYS: dict[str, Any] = {
    "mode": "base", "batch_size": 50, "optimizer": "adam", "lr": 3e-3, "momentum": 0.0, "weight_decay": 0.0,
    "steps": 0, "epochs": 1, "seed": 0, "drop_last": False, "max_abs": 48.0, "max_failure": 2e-4,
    "min_nodes": 1, "node_timeout_s": 20.0, "helper_timeout_s": 20.0, "helper_wait_s": 5.0, "eval_every": 10,
}


@dataclass(frozen=True, kw_only=True)
class TlppSettings:
    """Everything the TL++ roles need from the manifest (see the module docstring for each field)."""

    model: str = "digits_cnn"
    cut: int = 3
    channels: tuple[int, int, int] = (16, 32, 32)
    hidden: int = 64
    test: str = "builtin:digits:test"
    test_fraction: float = 0.2
    split_seed: int = 0
    num_shards: int = 4
    mode: str = "base"
    batch_size: int = 50
    optimizer: str = "adam"
    lr: float = 3e-3
    momentum: float = 0.0
    weight_decay: float = 0.0
    steps: int = 0
    epochs: int = 1
    seed: int = 0
    drop_last: bool = False
    max_abs: float = 48.0
    max_failure: float = 2e-4
    min_nodes: int = 1
    node_timeout_s: float = 20.0
    helper_timeout_s: float = 20.0
    helper_wait_s: float = 5.0
    eval_every: int = 10

    def __post_init__(self) -> None:
        _choice("model.name", self.model, MODELS)
        _choice("hyper.mode", self.mode, MODES)
        _choice("hyper.optimizer", self.optimizer, OPTIMIZERS)
        if not 1 <= self.cut < NUM_STAGES:
            raise ConfigError(f"model.cut must be in [1, {NUM_STAGES - 1}] for {self.model}'s {NUM_STAGES} "
                              f"stages, got {self.cut}")
        if self.mode == "secure" and self.cut != NUM_STAGES - 1:
            raise ConfigError(f"hyper.mode = \"secure\" needs model.cut = {NUM_STAGES - 1} (the server side must be "
                              f"the last Linear, an affine map on shares); got cut = {self.cut}")
        if len(self.channels) != 3 or min(self.channels) < 1:
            raise ConfigError(f"model.channels must be three widths >= 1, got {list(self.channels)}")
        for name in ("hidden", "num_shards", "batch_size", "min_nodes"):
            _at_least(name, getattr(self, name), 1)
        for name in ("steps", "epochs", "seed", "split_seed", "eval_every"):
            _at_least(name, getattr(self, name), 0)
        if self.steps == 0 and self.epochs == 0:
            raise ConfigError("hyper.steps and hyper.epochs are both 0: set one of them")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"data.test_fraction must be in (0, 1), got {self.test_fraction}")
        for name in ("lr", "max_abs", "node_timeout_s", "helper_timeout_s", "helper_wait_s"):
            _positive(name, getattr(self, name))
        for name in ("momentum", "weight_decay"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0.0):
                raise ConfigError(f"hyper.{name} must be a finite number >= 0, got {getattr(self, name)}")
        if not 0.0 < self.max_failure <= 1.0:
            raise ConfigError(f"hyper.max_failure must be in (0, 1], got {self.max_failure}")
        if self.helper_wait_s >= self.helper_timeout_s:
            raise ConfigError(f"hyper.helper_wait_s ({self.helper_wait_s}) must be shorter than hyper.helper_timeout_s "
                              f"({self.helper_timeout_s}), or the orchestrator gives up before the helper answers")

    @property
    def secure(self) -> bool:
        return self.mode == "secure"

    def build_model(self, device: torch.device | str) -> nn.Sequential:
        """The run's model, initialised from ``seed`` (every host builds the same one)."""
        return digits_cnn(channels=self.channels, hidden=self.hidden, num_classes=NUM_CLASSES, seed=self.seed,
                          device=device)

    def split(self, model: nn.Sequential) -> tuple[nn.Sequential, nn.Sequential]:
        """(node side, server side) of ``model`` at the cut; ConfigError if the split cannot work."""
        try:
            return split_model(model, self.cut)
        except TraversalError as exc:
            raise ConfigError(f"model.cut = {self.cut}: {exc}") from exc


def tlpp_settings(config: RunConfig) -> TlppSettings:
    """Parse and validate a run's TL++ settings; ConfigError names the manifest field."""
    if config.protocol != "tlpp":
        raise ConfigError(f"run {config.name} has protocol {config.protocol!r}; the TL++ roles (tlpp-server, helper, "
                          "node) need a run with protocol \"tlpp\"")
    model = _section("model", config.model, _MODEL_KEYS)
    data = _section("data", config.data, _DATA_KEYS)
    hyper = _section("hyper", config.hyper, _HYPER_KEYS)
    channels = model.pop("channels")
    if not isinstance(channels, list | tuple) or len(channels) != 3 or not all(_is_int(c) for c in channels):
        raise ConfigError(f"model.channels must be a list of three integers, got {channels!r}")
    return TlppSettings(model=model.pop("name"), channels=tuple(channels), **model, **data, **hyper)


def _section(name: str, table: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``table`` merged over ``defaults``, each value checked against its default's type."""
    unknown = sorted(set(table) - set(defaults))
    if unknown:
        raise ConfigError(f"{name}: unknown keys {unknown}; known: {sorted(defaults)}")
    out = {}
    for key, default in defaults.items():
        value = table.get(key, default)
        out[key] = _typed(f"{name}.{key}", value, default)
    return out


def _typed(field: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{field} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if not _is_int(value):
            raise ConfigError(f"{field} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{field} must be a finite number, got {value!r}")
        return float(value)
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"{field} must be a string, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _choice(field: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{field} {value!r} is not one of {', '.join(options)}")


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        section = "model" if name == "hidden" else "data" if name in ("num_shards", "split_seed") else "hyper"
        raise ConfigError(f"{section}.{name} must be >= {low}, got {value}")


def _positive(name: str, value: float) -> None:
    if not value > 0.0:
        raise ConfigError(f"hyper.{name} must be positive, got {value}")

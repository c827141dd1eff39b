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

from dataclasses import dataclass

import torch
from torch import nn

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.settings import setting
from gossamer.protocols.tlpp import TraversalError, digits_cnn, split_model

MODELS = ("digits_cnn",)
MODES = ("base", "secure")
OPTIMIZERS = ("adam", "sgd")
NUM_STAGES = 4
NUM_CLASSES = 10


@dataclass(frozen=True, kw_only=True)
class TlppSettings:
    """Everything the TL++ roles need from the manifest (see the module docstring for each field)."""

    model: str = setting("digits_cnn", table="model", key="name", choices=MODELS)
    cut: int = setting(3, table="model", low=1, high=NUM_STAGES - 1)
    channels: tuple[int, int, int] = setting((16, 32, 32), table="model")
    hidden: int = setting(64, table="model", low=1)
    test: str = setting("builtin:digits:test", table="data")
    test_fraction: float = setting(0.2, table="data", above=0.0, below=1.0)
    split_seed: int = setting(0, table="data", low=0)
    num_shards: int = setting(4, table="data", low=1)
    mode: str = setting("base", table="hyper", choices=MODES)
    batch_size: int = setting(50, table="hyper", low=1)
    optimizer: str = setting("adam", table="hyper", choices=OPTIMIZERS)
    lr: float = setting(3e-3, table="hyper", above=0.0)
    momentum: float = setting(0.0, table="hyper", low=0.0)
    weight_decay: float = setting(0.0, table="hyper", low=0.0)
    steps: int = setting(0, table="hyper", low=0)
    epochs: int = setting(1, table="hyper", low=0)
    seed: int = setting(0, table="hyper", low=0)
    drop_last: bool = setting(False, table="hyper")
    max_abs: float = setting(48.0, table="hyper", above=0.0)
    max_failure: float = setting(2e-4, table="hyper", above=0.0, high=1.0)
    min_nodes: int = setting(1, table="hyper", low=1)
    node_timeout_s: float = setting(20.0, table="hyper", above=0.0)
    helper_timeout_s: float = setting(20.0, table="hyper", above=0.0)
    helper_wait_s: float = setting(5.0, table="hyper", above=0.0)
    eval_every: int = setting(10, table="hyper", low=0)

    def __post_init__(self) -> None:
        if self.mode == "secure" and self.cut != NUM_STAGES - 1:
            raise ConfigError(f"hyper.mode = \"secure\" needs model.cut = {NUM_STAGES - 1} (the server side must be "
                              f"the last Linear, an affine map on shares); got cut = {self.cut}")
        if min(self.channels) < 1:
            raise ConfigError(f"model.channels must be three widths >= 1, got {list(self.channels)}")
        if self.steps == 0 and self.epochs == 0:
            raise ConfigError("hyper.steps and hyper.epochs are both 0: set one of them")
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

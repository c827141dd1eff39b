"""A BlockTrain run's settings, read from its signed manifest.

Manifest layout (run config TOML)::

    [model]   BlockTrainConfig keys (vocab, d_model, n_heads, context, num_blocks, layers_per_block,
              sigma_min, sigma_max, p_mean, p_std, sigma_data, embedding)
    [data]    source = "builtin:pydoc" | PATH, heldout_fraction
    [hyper]   versions (each block is trained to this version, then the run is finished; 0: until
              stopped), local_steps (K: steps a worker trains per update), batch_size, lr (AdamW),
              seed (initial stack), num_shards (a worker's shard is its peer id modulo this),
              deadline_s (a block version closes at this deadline after it opened, or earlier
              once every worker assigned to the block has sent its update), max_norm (an update
              whose L2 norm is larger is rejected), eval_batches (held-out batches the coordinator
              evaluates after each version; 0: none), traversal_timeout_s (a client's deadline
              for one whole traversal; each host forwards within what is left of it),
              max_batch (most sequences one traversal frame may carry)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.blocktrain import BlockTrainConfig
from gossamer.protocols.errors import ProtocolError

_HYPER_KEYS: dict[str, Any] = {
    "versions": 0, "local_steps": 20, "batch_size": 16, "lr": 1e-3, "seed": 0, "num_shards": 16,
    "deadline_s": 30.0, "max_norm": 1e4, "eval_batches": 2, "traversal_timeout_s": 30.0, "max_batch": 64,
}


@dataclass(frozen=True, kw_only=True)
class BlockTrainSettings:
    """Everything the BlockTrain roles need from the manifest (see the module docstring)."""

    model: BlockTrainConfig
    data_source: str = "builtin:pydoc"
    heldout_fraction: float = 0.05
    versions: int = 0
    local_steps: int = 20
    batch_size: int = 16
    lr: float = 1e-3
    seed: int = 0
    num_shards: int = 16
    deadline_s: float = 30.0
    max_norm: float = 1e4
    eval_batches: int = 2
    traversal_timeout_s: float = 30.0
    max_batch: int = 64

    def __post_init__(self) -> None:
        for name in ("local_steps", "batch_size", "num_shards", "max_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"hyper.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("versions", "seed", "eval_batches"):
            if getattr(self, name) < 0:
                raise ConfigError(f"hyper.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "deadline_s", "max_norm", "traversal_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"hyper.{name} must be a positive finite number, got {value}")
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"data.heldout_fraction must be in (0, 1), got {self.heldout_fraction}")


def blocktrain_settings(config: RunConfig) -> BlockTrainSettings:
    """Parse and validate a blocktrain run's manifest; ConfigError names the field."""
    if config.protocol != "blocktrain":
        raise ConfigError(f"run {config.name} uses protocol {config.protocol!r}; the BlockTrain roles need "
                          "run.protocol = \"blocktrain\"")
    unknown = set(config.hyper) - set(_HYPER_KEYS)
    if unknown:
        raise ConfigError(f"hyper: unknown keys {sorted(unknown)}; known: {sorted(_HYPER_KEYS)}")
    data = dict(config.data)
    try:
        model = BlockTrainConfig.from_dict(config.model)
    except ProtocolError as exc:
        raise ConfigError(f"run {config.name}: model: {exc}") from exc
    hyper = {key: _coerce(key, config.hyper.get(key, default), default)
             for key, default in _HYPER_KEYS.items()}
    try:
        heldout_fraction = float(data.get("heldout_fraction", 0.05))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"data.heldout_fraction must be a number, "
                          f"got {data.get('heldout_fraction')!r}") from exc
    return BlockTrainSettings(model=model, data_source=str(data.get("source", "builtin:pydoc")),
                              heldout_fraction=heldout_fraction, **hyper)


def _coerce(key: str, value: Any, default: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"hyper.{key} must be a number, got {value!r}")
    if isinstance(default, int) and not isinstance(value, int):
        raise ConfigError(f"hyper.{key} must be an integer, got {value!r}")
    return type(default)(value)

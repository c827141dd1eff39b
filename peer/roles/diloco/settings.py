"""A gossip-DiLoCo run's settings, read from its signed manifest.

Manifest layout (run config TOML)::

    [model]             ModelConfig keys (d_model, n_layers, n_heads, context, ...)
    [data]              source = "builtin:pydoc" | PATH, heldout_fraction
    [hyper]             rounds (0: until stopped), batch_size, seed, num_shards, w1_grace_s,
                        w2_deadline_s, eval_batches, max_norm, w1_clip_tau (> 0: the parameter
                        mix is clipped gossip: each neighbour's difference to our own parameters
                        is clipped to this L2 radius, so a Byzantine neighbour moves us at most
                        w_ij * tau per round), min_learners (round 0 starts once this many learners,
                        this one included, are live: learners that start together stay in step),
                        catch_up_rounds (a learner this many rounds behind the median of its peers
                        downloads their state and jumps to their round)
    [hyper.diloco]      DilocoConfig keys (inner_steps, inner_lr, outer_lr, outer_momentum, ...)
    [hyper.mixing]      MixingPlan keys (w1, w2, w2_subset, k)
    [hyper.aggregator]  name = "centered_clipping" (default) | "mean" | ..., and its parameters

The default aggregator is centered clipping iterated from the coordinate-wise median
(``robust.DEFAULT``): it held against every adaptive attack of ``scripts/experiments/byzantine.py``
(EXPERIMENTS.md). Its one-step form with worker momentum was retired (``robust_clipping``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.diloco import DilocoConfig
from gossamer.protocols.errors import InvalidSetting
from gossamer.protocols.mixing import MixingPlan
from gossamer.protocols.models import ModelConfig
from gossamer.protocols.robust import AGGREGATORS

_HYPER_KEYS = {"rounds": 0, "batch_size": 16, "seed": 0, "num_shards": 16, "w1_grace_s": 2.0,
               "w2_deadline_s": 15.0, "eval_batches": 4, "max_norm": 1e4, "w1_clip_tau": 0.0,
               "min_learners": 1, "catch_up_rounds": 3}


@dataclass(frozen=True, kw_only=True)
class LearnerSettings:
    """Everything a learner needs from the manifest (see the module docstring)."""

    model: ModelConfig
    diloco: DilocoConfig
    mixing: MixingPlan
    aggregator: str
    aggregator_params: dict[str, Any] = field(default_factory=dict)
    data_source: str = "builtin:pydoc"
    heldout_fraction: float = 0.05
    rounds: int = 0
    batch_size: int = 16
    seed: int = 0
    num_shards: int = 16
    w1_grace_s: float = 2.0
    w2_deadline_s: float = 15.0
    eval_batches: int = 4
    max_norm: float = 1e4
    w1_clip_tau: float = 0.0
    min_learners: int = 1
    catch_up_rounds: int = 3

    def __post_init__(self) -> None:
        if self.min_learners < 1:
            raise ConfigError(f"hyper.min_learners must be >= 1, got {self.min_learners}")
        if self.catch_up_rounds < 1:
            raise ConfigError(f"hyper.catch_up_rounds must be >= 1, got {self.catch_up_rounds}")


def learner_settings(config: RunConfig) -> LearnerSettings:
    """Parse and validate; ConfigError names the manifest field."""
    hyper = dict(config.hyper)
    nested = {name: hyper.pop(name, {}) for name in ("diloco", "mixing", "aggregator")}
    unknown = set(hyper) - set(_HYPER_KEYS)
    if unknown:
        raise ConfigError(f"hyper: unknown keys {sorted(unknown)}; known: {sorted(_HYPER_KEYS)}")
    aggregator = dict(nested["aggregator"])
    name = str(aggregator.pop("name", "centered_clipping"))
    if name not in AGGREGATORS:
        raise ConfigError(f"hyper.aggregator.name {name!r} is not one of {', '.join(AGGREGATORS)}")
    data = dict(config.data)
    try:
        return LearnerSettings(
            model=ModelConfig.from_dict(config.model), diloco=DilocoConfig.from_dict(nested["diloco"]),
            mixing=MixingPlan.from_dict(nested["mixing"]), aggregator=name, aggregator_params=aggregator,
            data_source=str(data.get("source", "builtin:pydoc")),
            heldout_fraction=float(data.get("heldout_fraction", 0.05)),
            **{key: type(default)(hyper.get(key, default)) for key, default in _HYPER_KEYS.items()},
        )
    except (InvalidSetting, TypeError, ValueError) as exc:
        raise ConfigError(f"run {config.name}: {exc}") from exc

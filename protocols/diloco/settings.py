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
                        downloads their state and jumps to their round), pacing ("fixed", the
                        default: every W2 wait is w2_deadline_s; "adaptive": it follows the measured
                        arrivals, w2_deadline_s its ceiling and w2_floor_s its floor, and neither
                        fail-slow learners nor learners whose record left the view are waited for;
                        either way fail-slow learners are flagged: ``pacing``)
    [hyper.diloco]      DilocoConfig keys (inner_steps, inner_lr, outer_lr, outer_momentum, ...)
    [hyper.mixing]      MixingPlan keys (w1, w2, w2_subset, k, mix_momentum, average_every:
                        every average_every-th round is an exact average, W1 and W2 global over
                        every parameter with the outer momentum averaged too, so the learners
                        leave it identical; 0 never; mix_momentum: W1 also mixes the momentum)
    [hyper.aggregator]  name = "geometric_median" (default) | "mean" | ..., and its parameters

The default aggregator is the geometric median (``robust.DEFAULT``): over the full grid of
``scripts/experiments/byzantine.py`` its worst cost under adaptive attack up to f = n/4 was the
smallest (EXPERIMENTS.md 2a; near n/2 the coordinate-wise median holds best). Centered clipping's one-step form with worker momentum was retired
(``robust_clipping``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.robust import AGGREGATORS, DEFAULT
from gossamer.protocols.core.settings import setting
from gossamer.protocols.diloco.core.mixing import MixingPlan
from gossamer.protocols.diloco.core.replica import DilocoConfig


@dataclass(frozen=True, kw_only=True)
class DilocoSettings:
    """Everything a learner needs from the manifest (see the module docstring)."""

    model: ModelConfig = setting(table="model", key="*", default_factory=ModelConfig)
    diloco: DilocoConfig = setting(table="hyper.diloco", key="*", default_factory=DilocoConfig)
    mixing: MixingPlan = setting(table="hyper.mixing", key="*", default_factory=MixingPlan)
    aggregator: str = setting(DEFAULT, table="hyper.aggregator", key="name", choices=tuple(AGGREGATORS))
    aggregator_params: dict[str, Any] = setting(table="hyper.aggregator", rest=True, default_factory=dict)
    data_source: str = setting("builtin:pydoc", table="data", key="source")
    heldout_fraction: float = setting(0.05, table="data", above=0.0, below=1.0)
    rounds: int = setting(0, table="hyper", low=0)
    batch_size: int = setting(16, table="hyper", low=1)
    seed: int = setting(0, table="hyper", low=0)
    num_shards: int = setting(16, table="hyper", low=1)
    w1_grace_s: float = setting(2.0, table="hyper", low=0.0)
    w2_deadline_s: float = setting(15.0, table="hyper", above=0.0)
    eval_batches: int = setting(4, table="hyper", low=1)
    max_norm: float = setting(1e4, table="hyper", above=0.0)
    w1_clip_tau: float = setting(0.0, table="hyper", low=0.0)
    min_learners: int = setting(1, table="hyper", low=1)
    catch_up_rounds: int = setting(3, table="hyper", low=1)
    pacing: str = setting("fixed", table="hyper", choices=("fixed", "adaptive"))
    w2_floor_s: float = setting(0.5, table="hyper", above=0.0)

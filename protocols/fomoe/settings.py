"""A FoMoE run's settings, read from its signed manifest (``run.protocol = "fomoe"``).

Manifest layout (run config TOML)::

    [model]             MoEConfig keys: ModelConfig's (d_model, n_layers, n_heads, context,
                        mlp_ratio, ...) and n_experts (E), top_k
    [data]              source = "builtin:pydoc" | PATH, heldout_fraction
    [hyper]             rounds (0: until stopped), batch_size, seed (the model's initialisation
                        and the placement's tie-breaks), num_shards (a host trains on shard
                        peer id mod num_shards), eval_batches, max_norm (a pseudo-gradient with a
                        larger L2 norm is rejected by the aggregators), min_hosts (round 0 starts
                        once this many expert hosts, this one included, are live),
                        update_deadline_s (how long a host waits for the members' updates after
                        its own inner phase), commit_deadline_s (how long it waits for their
                        commits, and a new holder for its experts' states)
    [hyper.diloco]      DilocoConfig keys (inner_steps, inner_lr, outer_lr, outer_momentum, ...)
    [hyper.fomoe]       FomoeConfig keys: replication (r, holders per expert), aux_loss_weight,
                        renormalize_skipped
    [hyper.aggregator]  dense = "mean" (default) or any ``protocols.core.robust`` aggregator, over every
                        member's dense pseudo-gradient; expert = "token_weighted_mean" (default:
                        the holders' mean weighted by the pairs each ran) or any robust
                        aggregator, over one expert's holders (a robust one needs r >= 2f + 1);
                        other keys (f, tau, ...) are that aggregator's parameters, given to both
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from gossamer.peer.errors import ConfigError
from gossamer.protocols.core import robust
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import setting
from gossamer.protocols.diloco.core.replica import DilocoConfig
from gossamer.protocols.fomoe.core import FomoeConfig, MoEConfig
from gossamer.protocols.fomoe.core.sync import Aggregator

TOKEN_WEIGHTED = "token_weighted_mean"


@dataclass(frozen=True, kw_only=True)
class FomoeSettings:
    """Everything an expert host needs from the manifest (see the module docstring)."""

    model: MoEConfig = setting(table="model", key="*", default_factory=MoEConfig)
    diloco: DilocoConfig = setting(table="hyper.diloco", key="*", default_factory=DilocoConfig)
    fomoe: FomoeConfig = setting(table="hyper.fomoe", key="*", default_factory=FomoeConfig)
    dense_aggregator: str = setting("mean", table="hyper.aggregator", key="dense", choices=tuple(robust.AGGREGATORS))
    expert_aggregator: str = setting(TOKEN_WEIGHTED, table="hyper.aggregator", key="expert",
                                     choices=(TOKEN_WEIGHTED, *robust.AGGREGATORS))
    aggregator_params: dict[str, Any] = setting(table="hyper.aggregator", rest=True, default_factory=dict)
    data_source: str = setting("builtin:pydoc", table="data", key="source")
    heldout_fraction: float = setting(0.05, table="data", above=0.0, below=1.0)
    rounds: int = setting(0, table="hyper", low=0)
    batch_size: int = setting(16, table="hyper", low=1)
    seed: int = setting(0, table="hyper", low=0)
    num_shards: int = setting(16, table="hyper", low=1)
    eval_batches: int = setting(4, table="hyper", low=1)
    max_norm: float = setting(1e4, table="hyper", above=0.0)
    min_hosts: int = setting(1, table="hyper", low=1)
    update_deadline_s: float = setting(30.0, table="hyper", above=0.0)
    commit_deadline_s: float = setting(10.0, table="hyper", above=0.0)

    def __post_init__(self) -> None:
        self.aggregators()  # a bad aggregator parameter is refused with the run config, not at round 1

    def aggregators(self) -> tuple[Aggregator, Aggregator]:
        """(dense, expert) aggregators, as ``protocols.fomoe.core.mix_round`` takes them."""
        params = dict(self.aggregator_params)
        try:
            dense = robust.build_aggregator(self.dense_aggregator, max_norm=self.max_norm, **params)
            if self.expert_aggregator == TOKEN_WEIGHTED:
                expert = functools.partial(robust.mean, trust_weights=True, max_norm=self.max_norm)
            else:
                expert = robust.build_aggregator(self.expert_aggregator, max_norm=self.max_norm, **params)
        except InvalidSetting as exc:
            raise ConfigError(f"hyper.aggregator: {exc}") from exc
        return dense, expert

"""A FoMoE run's settings, read from its signed manifest (``run.protocol = "fomoe"``); the table in
``README.md`` is generated from the fields' help."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from gossamer.protocols.core import robust
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import check, setting
from gossamer.protocols.core.text_data import TextRun
from gossamer.protocols.diloco.core.replica import DilocoConfig
from gossamer.protocols.fomoe.core import FomoeConfig, MoEConfig
from gossamer.protocols.fomoe.core.sync import Aggregator, PairLimits, clip_to_median_norm

TOKEN_WEIGHTED = "token_weighted_mean"


@dataclass(frozen=True, kw_only=True)
class FomoeSettings:
    """Everything an expert host needs from the manifest."""

    model: MoEConfig = setting(table="model", key="*", default_factory=MoEConfig,
                               doc="the MoE LM: a ModelConfig with n_experts and top_k")
    diloco: DilocoConfig = setting(table="hyper.diloco", key="*", default_factory=DilocoConfig,
                                   doc="the DiLoCo inner and outer steps of every round")
    fomoe: FomoeConfig = setting(table="hyper.fomoe", key="*", default_factory=FomoeConfig,
                                 doc="replication, the load-balancing weight, skip renormalisation")
    dense_aggregator: str = setting(robust.DEFAULT, table="hyper.aggregator", key="dense",
                                    choices=tuple(robust.AGGREGATORS),
                                    doc="the rule over every member's dense pseudo-gradient (mean: trusts every "
                                        "member, an allowlist run's choice)")
    expert_aggregator: str = setting(robust.DEFAULT, table="hyper.aggregator", key="expert",
                                     choices=(TOKEN_WEIGHTED, *robust.AGGREGATORS),
                                     doc="the rule over one expert's holders: a robust aggregator (with r = 2 the "
                                         "geometric median is their mean), or token_weighted_mean, their mean "
                                         "weighted by the pairs each claims (trusts every holder)")
    clip: bool = setting(True, table="hyper.aggregator", key="clip",
                         doc="scale each contribution down to the lower median of the contributions' norms before "
                             "either rule: a Byzantine holder of an expert moves it at most as far as the other "
                             "holder's own update would")
    aggregator_params: dict[str, Any] = setting(table="hyper.aggregator", rest=True, default_factory=dict,
                                                doc="the aggregators' parameters (f, tau, ...), given to both")
    text: TextRun = setting(spread=True, default_factory=lambda: TextRun(
        data_source="builtin:pydoc", heldout_fraction=0.05, seed=0, batch_size=16, num_shards=16, eval_batches=4,
        max_norm=1e4))
    rounds: int = setting(0, table="hyper", low=0, doc="rounds to train (0: until stopped)")
    min_hosts: int = setting(1, table="hyper", low=1,
                             doc="round 0 starts once this many expert hosts (this one included) are live")
    update_deadline_s: float = setting(30.0, table="hyper", above=0.0,
                                       doc="how long a host waits for the members' updates after its inner phase")
    commit_deadline_s: float = setting(10.0, table="hyper", above=0.0,
                                       doc="how long a host waits for the members' commits, and a new holder for "
                                           "its experts' states")

    def __post_init__(self) -> None:
        check(self)
        self.aggregators()  # a bad aggregator parameter is refused with the run config, not at round 1

    def aggregators(self) -> tuple[Aggregator, Aggregator]:
        """(dense, expert) aggregators, as ``protocols.fomoe.core.mix_round`` takes them."""
        params, max_norm = dict(self.aggregator_params), self.text.max_norm
        try:
            dense = robust.build_aggregator(self.dense_aggregator, max_norm=max_norm, **params)
            if self.expert_aggregator == TOKEN_WEIGHTED:
                expert = functools.partial(robust.mean, trust_weights=True, max_norm=max_norm)
            else:
                expert = robust.build_aggregator(self.expert_aggregator, max_norm=max_norm, **params)
        except InvalidSetting as exc:
            raise InvalidSetting(f"hyper.aggregator: {exc}") from exc
        if self.clip:
            return clip_to_median_norm(dense), clip_to_median_norm(expert)
        return dense, expert

    def pair_limits(self) -> PairLimits:
        """The most pairs an honest host reports for a round; an update claiming more is refused."""
        return PairLimits.of(batch_size=self.text.batch_size, context=self.model.context,
                             inner_steps=self.diloco.inner_steps, top_k=self.model.top_k)

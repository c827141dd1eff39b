"""A gossip-DiLoCo run's settings, read from its signed manifest (``run.protocol = "diloco"``); the
table in ``README.md`` is generated from the fields' help."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.robust import AGGREGATORS, DEFAULT
from gossamer.protocols.core.settings import check, setting
from gossamer.protocols.core.text_data import TextRun
from gossamer.protocols.diloco.core.aggregate import PseudoGradientAggregator
from gossamer.protocols.diloco.core.mixing import MixingPlan
from gossamer.protocols.diloco.core.replica import DilocoConfig


@dataclass(frozen=True, kw_only=True)
class DilocoSettings:
    """Everything a learner needs from the manifest."""

    model: ModelConfig = setting(table="model", key="*", default_factory=ModelConfig,
                                 doc="the byte-level transformer every learner trains a replica of")
    diloco: DilocoConfig = setting(table="hyper.diloco", key="*", default_factory=DilocoConfig,
                                   doc="the inner AdamW phase and the outer Nesterov step")
    mixing: MixingPlan = setting(table="hyper.mixing", key="*", default_factory=MixingPlan,
                                 doc="the W1 and W2 topologies, the W2 subset and the exact averages")
    aggregator: str = setting(DEFAULT, table="hyper.aggregator", key="name", choices=tuple(AGGREGATORS),
                              doc="the rule the W2 mix runs through (which one, against which threat: below)")
    aggregator_params: dict[str, Any] = setting(table="hyper.aggregator", rest=True, default_factory=dict,
                                                doc="the aggregator's parameters: f (how many W2 neighbours may be "
                                                    "Byzantine), tau, ...")
    text: TextRun = setting(spread=True, doc="the data and batch settings every text-LM run repeats",
                            default_factory=lambda: TextRun(data_source="builtin:pydoc", heldout_fraction=0.05,
                                                            seed=0, batch_size=16, num_shards=16, eval_batches=4,
                                                            max_norm=1e4))
    rounds: int = setting(0, table="hyper", low=0, doc="outer rounds to train (0: until stopped)")
    w1_grace_s: float = setting(2.0, table="hyper", low=0.0,
                                doc="how long a learner waits for its W1 neighbours' parameters after its inner phase")
    w2_deadline_s: float = setting(15.0, table="hyper", above=0.0,
                                   doc="the longest a learner's W2 wait for pseudo-gradients lasts (adaptive "
                                       "pacing's ceiling)")
    w1_clip_tau: float = setting(0.0, table="hyper", low=0.0,
                                 doc="> 0: clipped gossip in the W1 mix, each neighbour's difference to our own "
                                     "parameters clipped to this L2 radius (a Byzantine neighbour moves us at most "
                                     "w_ij * tau per round); 0: the radius follows w1_clip_ratio")
    w1_clip_ratio: float = setting(2.0, table="hyper", low=0.0,
                                   doc="with w1_clip_tau = 0 and two or more W1 neighbours: clip each neighbour's "
                                       "difference to this many times the lower median of the neighbours' distances "
                                       "to our own parameters (a Byzantine minority moves us at most w_ij * ratio * "
                                       "an honest distance per round); while none is beyond it, the plain mix bit "
                                       "for bit; 0: the plain mix")
    min_learners: int = setting(1, table="hyper", low=1,
                                doc="round 0 starts once this many learners (this one included) are live")
    catch_up_rounds: int = setting(3, table="hyper", low=1,
                                   doc="a learner this many rounds behind the median round of its peers downloads "
                                       "their state and jumps to their round; this far ahead, it waits for them")
    pacing: str = setting("fixed", table="hyper", choices=("fixed", "adaptive"),
                          doc='"fixed": every W2 wait lasts up to w2_deadline_s; "adaptive": it follows the '
                              "measured arrivals, and neither fail-slow learners nor learners whose record left "
                              "the view are waited for (either way fail-slow learners are flagged)")
    w2_floor_s: float = setting(0.5, table="hyper", above=0.0, doc="the shortest W2 wait adaptive pacing sets")

    def __post_init__(self) -> None:
        check(self)
        self.w2_aggregator(me="")  # a bad aggregator or parameter is refused with the run config, not at round 0

    def w2_aggregator(self, *, me: str) -> PseudoGradientAggregator:
        """The W2 mix of the learner ``me`` through the run's aggregator."""
        return PseudoGradientAggregator(self.aggregator, self.aggregator_params, plan=self.mixing,
                                        max_norm=self.text.max_norm, me=me)

"""A BlockTrain run's settings, read from its signed manifest (``[model]``, ``[data]``, ``[hyper]``);
the table in ``protocols/blocktrain/README.md`` is generated from these fields."""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.protocols.blocktrain.core import BlockTrainConfig
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import check, setting
from gossamer.protocols.core.text_data import TextRun


@dataclass(frozen=True, kw_only=True)
class BlockTrainText(TextRun):
    """The text-LM settings every text run repeats; BlockTrain's coordinator may skip evaluation."""

    eval_batches: int = setting(2, table="hyper", low=0,
                                doc="held-out batches (8 sequences each) the coordinator scores after each "
                                    "version; 0: none")


@dataclass(frozen=True, kw_only=True)
class BlockTrainSettings:
    """Everything the BlockTrain roles need from the manifest."""

    model: BlockTrainConfig = setting(table="model", key="*", default_factory=BlockTrainConfig,
                                      doc="the block stack's shape and noise schedule")
    text: BlockTrainText = setting(spread=True, default_factory=BlockTrainText)
    versions: int = setting(0, table="hyper", low=0,
                            doc="each block is trained to this version, then the run is finished; 0: until stopped")
    local_steps: int = setting(20, table="hyper", low=1, doc="K: AdamW steps a worker trains per update")
    lr: float = setting(1e-3, table="hyper", above=0.0, doc="a worker's AdamW learning rate")
    deadline_s: float = setting(30.0, table="hyper", above=0.0,
                                doc="a block version closes this long after it opened at the latest (earlier once "
                                    "every worker assigned to the block was heard from); adaptive pacing's ceiling")
    pacing: str = setting("adaptive", table="hyper", choices=("adaptive", "fixed"),
                          doc='"adaptive": a version waits as long as the measured update times say and a '
                              'persistently slow worker is no longer waited for; "fixed": always up to deadline_s')
    min_workers: int = setting(1, table="hyper", low=1,
                               doc="no block is assigned until this many block workers are live (the start only: "
                                   "a run whose workers leave goes on with those left)")
    route_timeout_s: float = setting(30.0, table="hyper", above=0.0,
                                     doc="a client's deadline for one whole route through the block servers; each "
                                         "host forwards within what is left of it")
    max_batch: int = setting(64, table="hyper", low=1, doc="most sequences one route frame may carry")
    sample_bytes: int = setting(64, table="hyper", low=0,
                                doc="bytes of the final stack's continuation of sample_prompt the coordinator "
                                    "prints when the run is finished; 0: no sample")
    sample_prompt: str = setting("The ", table="hyper", doc="the text the closing sample continues")
    sample_temperature: float = setting(0.8, table="hyper", low=0.0,
                                        doc="temperature of the closing sample (0: greedy)")

    def __post_init__(self) -> None:
        check(self)
        if self.sample_bytes and not self.sample_prompt.encode("utf-8"):
            raise InvalidSetting("hyper.sample_prompt: must be at least one byte when hyper.sample_bytes > 0")
        if self.sample_bytes and self.model.vocab != 256:
            raise InvalidSetting(f"hyper.sample_bytes: a sample needs a byte vocabulary (model.vocab = 256), "
                                 f"got {self.model.vocab}; set hyper.sample_bytes = 0")

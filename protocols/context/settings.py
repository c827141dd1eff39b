"""A context-parallel run's settings, read from its signed manifest (``run.protocol = "context"``);
the table in ``README.md`` is generated from the fields' help. The largest ring is
``model.context // chunk_tokens`` shards; further shards wait as spares."""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.protocols.context.core import InvalidRing, SubspaceConfig
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.settings import check, setting


@dataclass(frozen=True, kw_only=True)
class ContextSettings:
    """Everything a cp-shard needs from the manifest. Its data and batch fields are its own, not a
    ``TextRun``: every shard trains on the same sequences (no shards of the text), and the shares
    it sums are parts of one gradient (no absolute norm bound on a peer's update: ``share_clip`` is
    relative to the other shares)."""

    model: ModelConfig = setting(table="model", key="*", default_factory=ModelConfig,
                                 doc="the byte LM; dropout must be 0 (ring members recompute attention blocks)")
    subspace: SubspaceConfig = setting(table="model.subspace", key="*", default_factory=SubspaceConfig,
                                       doc="how keys and values are coded on the wire")
    data_source: str = setting("builtin:pydoc", table="data", key="source",
                               doc='the text: "builtin:pydoc" or a local file\'s path; every shard must read the '
                                   "same (a plan carries its digest)")
    heldout_fraction: float = setting(0.05, table="data", above=0.0, below=1.0,
                                      doc="the text's tail held out for the final evaluation")
    chunk_tokens: int = setting(32, table="hyper", low=1,
                                doc="T: tokens each shard holds of every sequence; a ring of P shards trains on "
                                    "P x T tokens, so one that lost a shard goes on with a shorter context")
    batch_size: int = setting(8, table="hyper", low=1, doc="sequences per step (the same on every shard)")
    min_shards: int = setting(2, table="hyper", low=1, doc="the smallest ring that trains")
    steps: int = setting(0, table="hyper", low=0, doc="steps to train (0: until stopped)")
    lr: float = setting(3e-3, table="hyper", above=0.0, doc="AdamW learning rate")
    weight_decay: float = setting(0.0, table="hyper", low=0.0, doc="AdamW decoupled weight decay")
    grad_clip: float = setting(1.0, table="hyper", above=0.0, doc="largest global norm of the summed gradient")
    share_clip: float = setting(1.0, table="hyper", low=0.0,
                                doc="the leader scales each member's gradient share down to this many times the "
                                    "median share norm before summing (0: the exact sum, trusting every member): a "
                                    "Byzantine shard then weighs at most this many honest shards; 0 or >= 1")
    seed: int = setting(0, table="hyper", low=0, doc="the model's initialisation and every step's batch")
    step_timeout_s: float = setting(30.0, table="hyper", above=0.0,
                                    doc="deadline of one step, from its plan to its update: a shard that dies makes "
                                        "the step abort within it")
    plan_timeout_s: float = setting(30.0, table="hyper", above=0.0,
                                    doc="deadline of a plan's answer (a joiner's state download included)")
    eval_batches: int = setting(4, table="hyper", low=1, doc="held-out batches evaluated when the run finishes")

    def __post_init__(self) -> None:
        check(self)
        if 0.0 < self.share_clip < 1.0:
            raise InvalidSetting(f"hyper.share_clip must be 0 (off) or at least 1 (a multiple of the median share "
                                 f"norm; under 1 every step shrinks), got {self.share_clip}")
        if self.model.dropout:
            raise InvalidSetting(f"model.dropout must be 0 for context parallelism (ring members recompute "
                                 f"attention blocks in the backward), got {self.model.dropout}")
        try:
            self.subspace.check_model(self.model)
        except InvalidRing as exc:
            raise InvalidSetting(f"model.subspace: {exc}") from exc
        if self.min_shards * self.chunk_tokens > self.model.context:
            raise InvalidSetting(f"hyper.min_shards x hyper.chunk_tokens = {self.min_shards} x {self.chunk_tokens} "
                                 f"tokens exceeds model.context = {self.model.context}: no ring could train")

    @property
    def max_shards(self) -> int:
        """The largest ring: as many chunks as fit the model's context."""
        return self.model.context // self.chunk_tokens

"""A context-parallel run's settings, read from its signed manifest (``run.protocol = "context"``).

Manifest layout (run config TOML)::

    [model]            ModelConfig keys (d_model, n_layers, n_heads, context, ...); dropout must
                       be 0 (ring members recompute attention blocks in the backward)
    [model.subspace]   rank (r coefficients per head per token for the keys, again for the
                       values; absent: dense keys and values), mixtures (M subspaces per head)
    [data]             source = "builtin:pydoc" | PATH (every shard must read the same text: a
                       plan carries its digest), heldout_fraction
    [hyper]            chunk_tokens (T: the tokens each shard holds of every sequence; a ring of
                       P shards trains on sequences of P x T tokens, so a ring that lost a shard
                       goes on with a shorter context), batch_size (sequences per step),
                       min_shards (the smallest ring that trains), steps (0: until stopped), lr,
                       weight_decay, grad_clip, seed (model initialisation and every step's batch),
                       step_timeout_s (deadline of one step, from its plan to its update: a shard
                       that dies makes the step abort within it), plan_timeout_s (deadline of a
                       plan's answer, a joiner's state download included), eval_batches (held-out
                       windows evaluated when the run finishes)

The largest ring is ``model.context // chunk_tokens`` shards; further shards wait as spares and
take the place of one that leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.peer.errors import ConfigError
from gossamer.protocols.context.core import InvalidRing, SubspaceConfig
from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.settings import setting


@dataclass(frozen=True, kw_only=True)
class ContextSettings:
    """Everything a cp-shard needs from the manifest (see the module docstring for each field)."""

    model: ModelConfig = setting(table="model", key="*", default_factory=ModelConfig)
    subspace: SubspaceConfig = setting(table="model.subspace", key="*", default_factory=SubspaceConfig)
    data_source: str = setting("builtin:pydoc", table="data", key="source")
    heldout_fraction: float = setting(0.05, table="data", above=0.0, below=1.0)
    chunk_tokens: int = setting(32, table="hyper", low=1)
    batch_size: int = setting(8, table="hyper", low=1)
    min_shards: int = setting(2, table="hyper", low=1)
    steps: int = setting(0, table="hyper", low=0)
    lr: float = setting(3e-3, table="hyper", above=0.0)
    weight_decay: float = setting(0.0, table="hyper", low=0.0)
    grad_clip: float = setting(1.0, table="hyper", above=0.0)
    seed: int = setting(0, table="hyper", low=0)
    step_timeout_s: float = setting(30.0, table="hyper", above=0.0)
    plan_timeout_s: float = setting(30.0, table="hyper", above=0.0)
    eval_batches: int = setting(4, table="hyper", low=1)

    def __post_init__(self) -> None:
        if self.model.dropout:
            raise ConfigError(f"model.dropout must be 0 for context parallelism (ring members recompute "
                              f"attention blocks in the backward), got {self.model.dropout}")
        try:
            self.subspace.check_model(self.model)
        except InvalidRing as exc:
            raise ConfigError(f"model.subspace: {exc}") from exc
        if self.min_shards * self.chunk_tokens > self.model.context:
            raise ConfigError(f"hyper.min_shards x hyper.chunk_tokens = {self.min_shards} x {self.chunk_tokens} "
                              f"tokens exceeds model.context = {self.model.context}: no ring could train")

    @property
    def max_shards(self) -> int:
        """The largest ring: as many chunks as fit the model's context."""
        return self.model.context // self.chunk_tokens

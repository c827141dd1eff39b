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
              evaluates after each version; 0: none), route_timeout_s (a client's deadline
              for one whole route through the block servers; each host forwards within what is
              left of it),
              max_batch (most sequences one route frame may carry),
              min_workers (no block is assigned until this many block workers are live; it
              gates the start only: a run whose workers leave goes on with those left),
              pacing ("adaptive": a version's deadline follows the workers' measured update
              times, ``deadline_s`` its ceiling, and a persistently slow worker is flagged and no
              longer waited for; "fixed": every version waits up to ``deadline_s``),
              sample_bytes (when the run is finished the coordinator continues ``sample_prompt``
              by this many bytes with the final stack, sampled autoregressively at
              ``sample_temperature``, and prints them; 0: no sample)
"""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.peer.errors import ConfigError
from gossamer.protocols.blocktrain.core import BlockTrainConfig
from gossamer.protocols.core.settings import setting


@dataclass(frozen=True, kw_only=True)
class BlockTrainSettings:
    """Everything the BlockTrain roles need from the manifest (see the module docstring)."""

    model: BlockTrainConfig = setting(table="model", key="*", default_factory=BlockTrainConfig)
    data_source: str = setting("builtin:pydoc", table="data", key="source")
    heldout_fraction: float = setting(0.05, table="data", above=0.0, below=1.0)
    versions: int = setting(0, table="hyper", low=0)
    local_steps: int = setting(20, table="hyper", low=1)
    batch_size: int = setting(16, table="hyper", low=1)
    lr: float = setting(1e-3, table="hyper", above=0.0)
    seed: int = setting(0, table="hyper", low=0)
    num_shards: int = setting(16, table="hyper", low=1)
    deadline_s: float = setting(30.0, table="hyper", above=0.0)
    max_norm: float = setting(1e4, table="hyper", above=0.0)
    eval_batches: int = setting(2, table="hyper", low=0)
    route_timeout_s: float = setting(30.0, table="hyper", above=0.0)
    max_batch: int = setting(64, table="hyper", low=1)
    pacing: str = setting("adaptive", table="hyper", choices=("adaptive", "fixed"))
    min_workers: int = setting(1, table="hyper", low=1)
    sample_bytes: int = setting(64, table="hyper", low=0)
    sample_prompt: str = setting("The ", table="hyper")
    sample_temperature: float = setting(0.8, table="hyper", low=0.0)

    def __post_init__(self) -> None:
        if self.sample_bytes and not self.sample_prompt.encode("utf-8"):
            raise ConfigError("hyper.sample_prompt: must be at least one byte when hyper.sample_bytes > 0")
        if self.sample_bytes and self.model.vocab != 256:
            raise ConfigError(f"hyper.sample_bytes: a sample needs a byte vocabulary (model.vocab = 256), "
                              f"got {self.model.vocab}; set hyper.sample_bytes = 0")

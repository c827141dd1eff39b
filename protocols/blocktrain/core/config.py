"""``BlockTrainConfig``: the shape of a block stack and its noise schedule (the manifest's table)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gossamer.protocols.blocktrain.core.bands import band_edges
from gossamer.protocols.blocktrain.core.errors import BlockTrainError, check_finite, check_positive_int
from gossamer.protocols.core.tables import table_kwargs

EMBEDDINGS = ("frozen", "averaged")


@dataclass(frozen=True, kw_only=True)
class BlockTrainConfig:
    """Shape of a block stack and its noise schedule (the run manifest's BlockTrain table)."""

    vocab: int = 256  # token ids (bytes: 256)
    d_model: int = 128  # width of every block and of the embedding E
    n_heads: int = 4  # attention heads per layer; must divide d_model
    context: int = 64  # longest sequence a block accepts (positional table size)
    num_blocks: int = 4  # B: blocks, one noise band each
    layers_per_block: int = 1  # transformer layers inside one block
    sigma_min: float = 1.0  # lowest training noise level
    sigma_max: float = 10.0  # highest noise level; inference starts here
    p_mean: float = -1.2  # log-normal mean of ln(sigma)
    p_std: float = 1.2  # log-normal std of ln(sigma)
    sigma_data: float = 0.5  # EDM sigma_d; also the L2 norm of every row of E (the clean targets)
    embedding: str = "frozen"  # "frozen" (never trained) or "averaged" (trained, averaged by the network)

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "n_heads", "context", "num_blocks", "layers_per_block"):
            check_positive_int(name, getattr(self, name))
        if self.vocab < 2:
            raise BlockTrainError(f"vocab: must be at least 2, got {self.vocab}")
        if self.d_model % self.n_heads:
            raise BlockTrainError(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        for name in ("sigma_min", "sigma_max", "p_std", "sigma_data"):
            check_finite(name, getattr(self, name), positive=True)
        check_finite("p_mean", self.p_mean)
        if not self.sigma_min < self.sigma_max:
            raise BlockTrainError(f"sigma_min: {self.sigma_min} must be below sigma_max={self.sigma_max}")
        if self.embedding not in EMBEDDINGS:
            raise BlockTrainError(f"embedding: must be one of {list(EMBEDDINGS)}, got {self.embedding!r}")
        for name in ("sigma_min", "sigma_max", "p_mean", "p_std", "sigma_data"):
            object.__setattr__(self, name, float(getattr(self, name)))
        band_edges(self)  # refuses a range that carries no probability mass

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BlockTrainConfig:
        """Build from a manifest table (any subset of the fields); unknown keys are refused."""
        return cls(**table_kwargs(cls, d, what="blocktrain", error=BlockTrainError))

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (the inverse of ``from_dict``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


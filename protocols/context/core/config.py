"""How keys and values are coded on the wire: ``SubspaceConfig`` (the manifest's ``[model.subspace]``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gossamer.protocols.context.core.errors import InvalidRing
from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.tables import table_kwargs

MAX_MIXTURES = 256
"""A subspace index travels as one byte."""


@dataclass(frozen=True, kw_only=True)
class SubspaceConfig:
    """The key/value reparameterisation of every attention layer.

    Attributes:
        rank: r, coefficients per head per token for the keys and again for the values
            (K = C_K U_K^T with U_K of shape d_head x r, orthonormal); None keeps dense keys and
            values (plain ``ByteTransformer`` attention, d_head numbers each on the wire).
        mixtures: M, subspaces per head; with M > 1 a gate picks one per token and the message
            carries its index (one byte per head per token) beside the coefficients.
    """

    rank: int | None = None
    mixtures: int = 1

    def __post_init__(self) -> None:
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int)
                                      or self.rank < 1):
            raise InvalidRing(f"rank: must be a positive integer or None (dense), got {self.rank!r}")
        mixtures = self.mixtures
        if isinstance(mixtures, bool) or not isinstance(mixtures, int) or not 1 <= mixtures <= MAX_MIXTURES:
            raise InvalidRing(f"mixtures: must be an integer in [1, {MAX_MIXTURES}], got {mixtures!r}")
        if self.rank is None and mixtures != 1:
            raise InvalidRing("mixtures: a mixture of subspaces needs a rank (rank = None is dense)")

    @property
    def dense(self) -> bool:
        return self.rank is None

    def check_model(self, model: ModelConfig) -> None:
        """InvalidRing unless the rank fits the model's heads (r <= d_head)."""
        d_head = model.d_model // model.n_heads
        if self.rank is not None and self.rank > d_head:
            raise InvalidRing(f"rank: {self.rank} exceeds d_head = {d_head} (d_model {model.d_model} / "
                              f"{model.n_heads} heads)")

    def width(self, model: ModelConfig) -> int:
        """Numbers per head per token on the wire, for the keys and again for the values."""
        return model.d_model // model.n_heads if self.rank is None else self.rank

    def label(self) -> str:
        """A short name: ``dense``, ``r2``, ``r1-m4``."""
        if self.rank is None:
            return "dense"
        return f"r{self.rank}" + (f"-m{self.mixtures}" if self.mixtures > 1 else "")

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> SubspaceConfig:
        """From a manifest table; unknown keys are refused."""
        return cls(**table_kwargs(cls, table, what="subspace", error=InvalidRing))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

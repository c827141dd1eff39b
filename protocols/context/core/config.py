"""How keys and values are coded on the wire: ``SubspaceConfig`` (the manifest's ``[model.subspace]``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gossamer.protocols.context.core.errors import InvalidRing
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.settings import check, read_table, setting

MAX_MIXTURES = 256
"""A subspace index travels as one byte."""


@dataclass(frozen=True, kw_only=True)
class SubspaceConfig:
    """The key/value reparameterisation of every attention layer: K = C_K U_K^T with U_K of shape
    d_head x r, orthonormal (and again for the values)."""

    rank: int | None = setting(None, low=1, doc="r: coefficients per head per token for the keys, again for the "
                                                "values (none: dense keys and values, d_head numbers each)")
    mixtures: int = setting(1, low=1, high=MAX_MIXTURES, doc="M: subspaces per head; with M > 1 a gate picks one "
                                                             "per token and the message carries its index (a byte)")

    def __post_init__(self) -> None:
        check(self)
        if self.rank is None and self.mixtures != 1:
            raise InvalidSetting("mixtures must be 1 without a rank (rank = none is dense)")

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
        """From a manifest table; unknown keys and bad values are refused (InvalidSetting)."""
        return read_table(cls, table, path="subspace")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

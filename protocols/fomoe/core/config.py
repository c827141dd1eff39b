"""FoMoE settings: the MoE model's shape (``MoEConfig``, the manifest's ``[model]`` table) and the
protocol's own hyperparameters (``FomoeConfig``, FoMoE's keys of ``[hyper]``; the DiLoCo keys stay
in ``protocols.diloco.core.replica.DilocoConfig``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.tables import table_kwargs


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidSetting(f"{name}: must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class MoEConfig(ModelConfig):
    """A ``ModelConfig`` whose every block's feed-forward part is a mixture of ``n_experts``
    experts, each an MLP of hidden width ``mlp_ratio * d_model``, ``top_k`` of them per token."""

    n_experts: int = 8  # E: routed experts per block
    top_k: int = 2  # experts each token is routed to

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("n_experts", self.n_experts, 1)
        _check_int("top_k", self.top_k, 1)
        if self.top_k > self.n_experts:
            raise InvalidSetting(f"top_k: {self.top_k} exceeds n_experts={self.n_experts}")


@dataclass(frozen=True, kw_only=True)
class FomoeConfig:
    """FoMoE's hyperparameters beside DiLoCo's."""

    replication: int = 2
    """r: peers that hold each expert (capped at the number of live peers; r = W is a full replica)."""
    aux_loss_weight: float = 0.01
    """Weight of the load-balancing loss (on the full router distribution) in the training loss."""
    renormalize_skipped: bool = False
    """Rescale a token's resident gates to its full top-k gate mass when some of its experts are
    skipped (default: skipped pairs just contribute zero)."""

    def __post_init__(self) -> None:
        _check_int("replication", self.replication, 1)
        weight = self.aux_loss_weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
            raise InvalidSetting(f"aux_loss_weight: must be a finite number >= 0, got {weight!r}")
        object.__setattr__(self, "aux_loss_weight", float(weight))
        if not isinstance(self.renormalize_skipped, bool):
            raise InvalidSetting(f"renormalize_skipped: must be a bool, got {self.renormalize_skipped!r}")

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """The keys ``from_dict`` accepts (lets a caller split a shared ``[hyper]`` table)."""
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> FomoeConfig:
        return cls(**table_kwargs(cls, table, what="fomoe", error=InvalidSetting))

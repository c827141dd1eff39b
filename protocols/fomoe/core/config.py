"""FoMoE's config classes: the MoE model's shape (``MoEConfig``, the manifest's ``[model]``) and the
protocol's own hyperparameters (``FomoeConfig``, ``[hyper.fomoe]``)."""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.settings import check, setting


@dataclass(frozen=True, kw_only=True)
class MoEConfig(ModelConfig):
    """A ``ModelConfig`` whose every block's feed-forward part is a mixture of ``n_experts``
    experts, each an MLP of hidden width ``mlp_ratio * d_model``, ``top_k`` of them per token."""

    n_experts: int = setting(8, low=1, doc="E: routed experts per block")
    top_k: int = setting(2, low=1, doc="experts each token is routed to (at most n_experts)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self)
        if self.top_k > self.n_experts:
            raise InvalidSetting(f"top_k must be <= n_experts = {self.n_experts}, got {self.top_k}")


@dataclass(frozen=True, kw_only=True)
class FomoeConfig:
    """FoMoE's hyperparameters beside DiLoCo's."""

    replication: int = setting(2, low=1, doc="r: hosts that hold each expert (at most the live hosts; r = W is a "
                                             "full replica)")
    aux_loss_weight: float = setting(0.01, low=0.0, doc="weight of the load-balancing loss (on the full router "
                                                        "distribution) in the training loss")
    renormalize_skipped: bool = setting(False, doc="rescale a token's resident gates to its full top-k gate mass "
                                                   "when some of its experts are skipped (false: skipped pairs add 0)")

    def __post_init__(self) -> None:
        check(self)

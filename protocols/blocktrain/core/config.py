"""``BlockTrainConfig``: the shape of a block stack and its noise schedule (a run's ``[model]`` table).
Every refusal is an ``InvalidSetting`` naming the field."""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.protocols.blocktrain.core.bands import band_edges
from gossamer.protocols.blocktrain.core.errors import BlockTrainError
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import check, setting

EMBEDDINGS = ("frozen", "averaged")


@dataclass(frozen=True, kw_only=True)
class BlockTrainConfig:
    """Shape of a block stack and its noise schedule (the run manifest's BlockTrain table)."""

    vocab: int = setting(256, low=2, doc="token ids (bytes: 256)")
    d_model: int = setting(128, low=1, doc="width of every block and of the embedding E")
    n_heads: int = setting(4, low=1, doc="attention heads per layer; must divide d_model")
    context: int = setting(64, low=1, doc="longest sequence a block accepts (positional table size)")
    num_blocks: int = setting(4, low=1, doc="B: blocks, one noise band each")
    layers_per_block: int = setting(1, low=1, doc="transformer layers inside one block")
    sigma_min: float = setting(1.0, above=0.0, doc="lowest training noise level")
    sigma_max: float = setting(10.0, above=0.0, doc="highest noise level; inference starts here")
    p_mean: float = setting(-1.2, doc="log-normal mean of ln(sigma)")
    p_std: float = setting(1.2, above=0.0, doc="log-normal std of ln(sigma)")
    sigma_data: float = setting(0.5, above=0.0,
                                doc="EDM sigma_d; also the L2 norm of every row of E (the clean targets)")
    embedding: str = setting("frozen", choices=EMBEDDINGS,
                             doc='"frozen" (drawn from the seed, never trained) or "averaged" (trained, '
                                 "averaged over all block workers)")

    def __post_init__(self) -> None:
        check(self)
        if self.d_model % self.n_heads:
            raise InvalidSetting(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        if not self.sigma_min < self.sigma_max:
            raise InvalidSetting(f"sigma_min: {self.sigma_min} must be below sigma_max={self.sigma_max}")
        try:
            band_edges(self)  # refuses a range that carries no probability mass
        except BlockTrainError as exc:
            raise InvalidSetting(str(exc)) from None

"""The MoE byte LM: ``ByteTransformer`` with every block's MLP a mixture of experts. Names keep
``protocols.core.models``' scheme (``blocks.{i}.mlp.router.weight``,
``blocks.{i}.mlp.experts.{e}.fc.*``/``.proj.*``); everything not an expert parameter is dense.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

import torch

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ByteTransformer, _Block, build_initialised
from gossamer.protocols.fomoe.core.config import MoEConfig
from gossamer.protocols.fomoe.core.layer import LayerRouting, MixtureOfExperts

ExpertKey = tuple[int, int]
"""(block index, expert index): one expert of one block, the unit that is synchronised."""

_EXPERT_NAME = re.compile(r"^blocks\.(\d+)\.mlp\.experts\.(\d+)\.")


def expert_of(name: str) -> ExpertKey | None:
    """(block, expert) of an expert parameter's name; None for a dense parameter."""
    match = _EXPERT_NAME.match(name)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def expert_prefix(block: int, expert: int) -> str:
    return f"blocks.{block}.mlp.experts.{expert}"


@dataclass(frozen=True, eq=False)
class Routing:
    """What one forward pass routed, over all blocks (rows are blocks)."""

    aux_loss: torch.Tensor
    """Sum over blocks of the load-balancing loss (scalar, differentiable in the routers)."""
    routed: torch.Tensor
    """[n_layers, E] int64: (token, expert) pairs the routers chose."""
    computed: torch.Tensor
    """[n_layers, E] int64: pairs actually run (the resident ones)."""
    top1: torch.Tensor
    """[n_layers, N] int64: each token's most probable expert in each block."""

    @classmethod
    def stack(cls, layers: list[LayerRouting]) -> Routing:
        return cls(torch.stack([r.aux_loss for r in layers]).sum(), torch.stack([r.routed for r in layers]),
                   torch.stack([r.computed for r in layers]), torch.stack([r.top1 for r in layers]))

    @property
    def skip_fraction(self) -> float:
        """Fraction of the chosen pairs that were skipped (their expert is not resident)."""
        total = int(self.routed.sum())
        return 1.0 - int(self.computed.sum()) / total if total else 0.0


class _MoEBlock(_Block):
    def __init__(self, config: MoEConfig) -> None:
        super().__init__(config, MixtureOfExperts(config))

    def forward(self, x: torch.Tensor, *, resident: torch.Tensor | None = None,  # type: ignore[override]
                renormalize: bool = False) -> tuple[torch.Tensor, LayerRouting]:
        x = x + self.drop(self.attn(self.ln1(x)))
        out, routing = self.mlp(self.ln2(x), resident=resident, renormalize=renormalize)
        return x + self.drop(out), routing


class MoETransformer(ByteTransformer):
    """Causal byte LM with MoE blocks: ``forward(tokens, resident=...) -> logits``.

    ``resident`` (expert indices, held in every block) selects the experts this peer runs; None
    runs all of them (the whole model, e.g. for evaluation). Build it through ``build_moe_model``.
    """

    def __init__(self, config: MoEConfig) -> None:
        if not isinstance(config, MoEConfig):
            raise InvalidSetting(f"config: MoETransformer needs an MoEConfig, got {type(config).__name__}")
        super().__init__(config)
        self.blocks = torch.nn.ModuleList(_MoEBlock(config) for _ in range(config.n_layers))

    def forward(self, tokens: torch.Tensor, *, resident: Collection[int] | None = None,  # type: ignore[override]
                renormalize: bool = False) -> torch.Tensor:
        return self.forward_routed(tokens, resident=resident, renormalize=renormalize)[0]

    def forward_routed(self, tokens: torch.Tensor, *, resident: Collection[int] | None = None,
                       renormalize: bool = False) -> tuple[torch.Tensor, Routing]:
        """Logits and what was routed; only ``resident`` experts are run (see ``layer``)."""
        mask = None if resident is None else self.resident_mask(resident, device=tokens.device)
        x = self.embed_tokens(tokens)
        layers = []
        for block in self.blocks:
            x, routing = block(x, resident=mask, renormalize=renormalize)
            layers.append(routing)
        return self.readout(x), Routing.stack(layers)

    def resident_mask(self, resident: Collection[int], *, device: torch.device | str) -> torch.Tensor:
        """[E] bool mask of ``resident``; refuses an index outside 0..E-1."""
        n = self.config.n_experts
        bad = sorted(e for e in resident if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < n)
        if bad:
            raise InvalidSetting(f"resident: expert indices {bad} are outside 0..{n - 1}")
        mask = torch.zeros(n, dtype=torch.bool, device=device)
        mask[list(resident)] = True
        return mask


def build_moe_model(config: MoEConfig, *, seed: int, device: torch.device | str = "cpu") -> MoETransformer:
    """A freshly initialised MoE LM (GPT-2 init, as ``build_model``); same seed, same parameters."""
    if not isinstance(config, MoEConfig):
        raise InvalidSetting(f"config: build_moe_model needs an MoEConfig, got {type(config).__name__}")
    return build_initialised(MoETransformer, config, seed=seed, device=device)

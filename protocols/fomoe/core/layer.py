"""One mixture-of-experts feed-forward layer: top-k routing over all E experts, only resident
(token, expert) pairs gathered and run (a skipped pair costs nothing), and the Switch load-
balancing loss on the full router distribution, so a peer cannot lower it by routing onto its
own experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.core.models import _MLP
from gossamer.protocols.fomoe.core.config import MoEConfig


@dataclass(frozen=True, eq=False)
class LayerRouting:
    """What one layer routed in one forward pass."""

    aux_loss: torch.Tensor
    """Scalar load-balancing loss (differentiable in the router)."""
    routed: torch.Tensor
    """[E] int64: (token, expert) pairs the router chose per expert (whether resident or not)."""
    computed: torch.Tensor
    """[E] int64: pairs actually run per expert (resident ones); zero for every skipped expert."""
    top1: torch.Tensor
    """[N] int64: each token's most probable expert."""


class MixtureOfExperts(nn.Module):
    """``router`` and ``experts.{e}`` (each a ``protocols.core.models`` MLP: ``fc``, ``proj``)."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.n_experts = config.n_experts
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(_MLP(config) for _ in range(config.n_experts))

    def forward(self, x: torch.Tensor, *, resident: torch.Tensor | None = None,
                renormalize: bool = False) -> tuple[torch.Tensor, LayerRouting]:
        """``x`` [..., d_model] -> (output of the same shape, routing). ``resident`` is a [E] bool
        mask of the experts this peer holds (None: all)."""
        flat = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.router(flat).float(), dim=-1)
        gates, chosen = probs.topk(self.top_k, dim=-1)
        routed = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        aux = self.n_experts * (routed.to(probs.dtype) / chosen.numel() * probs.mean(dim=0)).sum()
        keep = torch.ones_like(chosen, dtype=torch.bool) if resident is None else resident[chosen]
        if renormalize and resident is not None:
            kept_mass = (gates * keep).sum(dim=-1, keepdim=True)
            gates = gates * gates.sum(dim=-1, keepdim=True) / kept_mass.clamp_min(torch.finfo(gates.dtype).tiny)
        out, computed = self._run_resident(flat, chosen, gates, keep)
        return out.view_as(x), LayerRouting(aux, routed, computed, chosen[:, 0])

    def _run_resident(self, flat: torch.Tensor, chosen: torch.Tensor, gates: torch.Tensor,
                      keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the kept pairs by expert, run each expert once on its tokens, scatter back."""
        tokens = torch.arange(flat.shape[0], device=flat.device).unsqueeze(1).expand_as(chosen)[keep]
        experts, pair_gates = chosen[keep], gates[keep]
        order = torch.argsort(experts, stable=True)
        tokens, pair_gates = tokens[order], pair_gates[order]
        computed = torch.bincount(experts, minlength=self.n_experts)
        out = torch.zeros_like(flat)
        if tokens.numel() == 0:
            return out, computed
        pieces = flat[tokens].split(computed.tolist())
        results = [self.experts[e](piece) for e, piece in enumerate(pieces) if piece.shape[0]]
        out.index_add_(0, tokens, torch.cat(results) * pair_gates.unsqueeze(1).to(flat.dtype))
        return out, computed

"""Blockwise causal attention with online-softmax accumulation: one block forward, the ``merge``
that folds it into the running output, and the FlashAttention backward of one block. q, k, v, o,
do are [batch, heads, tokens, d_head]; lse and delta [batch, heads, tokens].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _exp_scores(q: Tensor, k: Tensor, causal: bool, shift: Tensor | None) -> tuple[Tensor, Tensor]:
    """exp(q k^T / sqrt(d) - shift) (row maxima when ``shift`` is None), masked above the diagonal
    when ``causal``; computed in place in one buffer. Returns (exponentials, shift used)."""
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
    if causal:
        length = q.shape[-2]
        upper = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        scores.masked_fill_(upper, float("-inf"))
    shift = scores.amax(dim=-1) if shift is None else shift
    return scores.sub_(shift.unsqueeze(-1)).exp_(), shift


@torch.no_grad()
def block_forward(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> tuple[Tensor, Tensor]:
    """Attention of ``q`` over one block: (normalised output, log-sum-exp per query)."""
    weights, top = _exp_scores(q, k, causal, None)
    total = weights.sum(dim=-1)
    out = (weights @ v).div_(total.unsqueeze(-1))
    return out, top.add_(total.log_())


@torch.no_grad()
def merge(acc: tuple[Tensor, Tensor] | None, block: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Fold one block's (output, lse) into the running pair (None: the first block)."""
    if acc is None:
        return block
    out_a, lse_a = acc
    out_b, lse_b = block
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * torch.exp(lse_a - lse).unsqueeze(-1) + out_b * torch.exp(lse_b - lse).unsqueeze(-1)
    return out, lse


@torch.no_grad()
def block_backward(q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, *,
                   causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """One block's share of dq and the block's dk, dv, given the FINAL lse and delta."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    probs, _ = _exp_scores(q, k, causal, lse)
    dv = probs.transpose(-1, -2) @ do
    dscores = (do @ v.transpose(-1, -2)).sub_(delta.unsqueeze(-1)).mul_(probs)
    dq = (dscores @ k).mul_(scale)
    dk = (dscores.transpose(-1, -2) @ q).mul_(scale)
    return dq, dk, dv


def output_delta(out: Tensor, dout: Tensor) -> Tensor:
    """``rowsum(do * o)``: the term of the softmax backward shared by every block."""
    return (dout * out).sum(dim=-1)

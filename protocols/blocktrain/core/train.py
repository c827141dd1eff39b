"""Training one block: its denoising loss, one optimizer step that touches nothing else, held-out CE.
``train_step`` refuses an optimizer holding anything outside ``block_parameters(stack, k)``; the
formulas are in ``protocols/blocktrain/README.md``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.blocktrain.core.bands import loss_weight, sample_sigma
from gossamer.protocols.blocktrain.core.errors import BlockTrainError, check_block, check_positive_int
from gossamer.protocols.blocktrain.core.inference import denoise_pass
from gossamer.protocols.blocktrain.core.model import (
    BlockStack,
    block_parameters,
    check_tokens,
    denoise,
    target_embedding,
)


@dataclass(frozen=True)
class BlockLoss:
    """One batch's objective: ``loss`` (lambda-weighted, what is optimised) and plain ``ce`` (nats)."""

    loss: torch.Tensor
    ce: torch.Tensor


def block_loss(
    stack: BlockStack, k: int, context: torch.Tensor, targets: torch.Tensor, *, generator: torch.Generator
) -> BlockLoss:
    """Block k's denoising objective on one batch (one sigma per sequence, drawn in block k's band)."""
    check_block(stack.config, k)
    check_tokens(stack, "context", context)
    check_tokens(stack, "targets", targets)
    if context.shape != targets.shape:
        raise BlockTrainError(f"targets: shape {tuple(targets.shape)} differs from context {tuple(context.shape)}")
    weight = target_embedding(stack)
    sigma = sample_sigma(stack.config, k, context.shape[0], generator=generator).to(weight.device, weight.dtype)
    eps = torch.randn((*targets.shape, stack.config.d_model), generator=generator, device=generator.device)
    z = F.embedding(targets, weight.detach()) + sigma[:, None, None] * eps.to(weight.device, weight.dtype)
    logits = F.linear(denoise(stack, k, context, z, sigma), weight)
    ce = F.cross_entropy(logits.transpose(1, 2).float(), targets, reduction="none").mean(dim=1)
    return BlockLoss(loss=(loss_weight(sigma.float(), stack.config.sigma_data) * ce).mean(), ce=ce.mean())


def train_step(
    stack: BlockStack,
    k: int,
    context: torch.Tensor,
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    generator: torch.Generator,
    grad_clip: float | None = 1.0,
) -> float:
    """One optimizer step on block k only; returns the (lambda-weighted) loss.

    Refuses an optimizer that holds anything outside ``block_parameters(stack, k)``.
    """
    check_block(stack.config, k)
    allowed = {id(p) for p in block_parameters(stack, k)}
    foreign = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in allowed]
    if foreign:
        raise BlockTrainError(f"optimizer: holds {len(foreign)} tensors outside block {k}'s parameters")
    if grad_clip is not None and not grad_clip > 0:
        raise BlockTrainError(f"grad_clip: must be positive or None, got {grad_clip!r}")
    result = block_loss(stack, k, context, targets, generator=generator)
    optimizer.zero_grad(set_to_none=True)
    result.loss.backward()
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(block_parameters(stack, k), grad_clip)
    optimizer.step()
    return float(result.loss.detach())




@torch.no_grad()
def heldout_ce(stack: BlockStack, data: bytes, *, batches: int, batch_size: int, generator: torch.Generator) -> float:
    """Mean next-byte cross-entropy (nats) after one full pass, on evenly spaced windows of ``data``."""
    check_positive_int("batches", batches)
    check_positive_int("batch_size", batch_size)
    context = stack.config.context
    if len(data) < context + 1:
        raise BlockTrainError(f"data: {len(data)} bytes is shorter than context + 1 = {context + 1}")
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    last_start = tokens.numel() - context - 1
    count = min(batches * batch_size, last_start + 1)
    starts = torch.arange(count) * last_start // max(count - 1, 1)
    device = stack.embed.weight.device
    total = 0.0
    for chunk in starts.split(batch_size):
        window = tokens[chunk[:, None] + torch.arange(context + 1)].to(device=device, dtype=torch.long)
        logits = denoise_pass(stack, window[:, :-1], generator=generator)
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten(), reduction="sum"))
    return total / (count * context)

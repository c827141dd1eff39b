"""The block stack: the shared embedding E and one denoiser per noise band, and D for one block.
``build_stack`` draws a stack from a seed; ``block_state`` / ``load_block_state`` (and E's pair)
move one block's parameters, checked before anything is copied. What a block reads, and why:
``protocols/blocktrain/README.md``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.blocktrain.core.bands import edm_coefficients
from gossamer.protocols.blocktrain.core.config import BlockTrainConfig
from gossamer.protocols.blocktrain.core.errors import BlockTrainError, check_block
from gossamer.protocols.core.models import ModelConfig, _Block, init_transformer_weights


class _Denoiser(nn.Module):
    """One block: F = block(x, c_in z, c_noise) -> [batch, T, d_model], causal over positions.

    The block owns its context embedding ``tok`` (so a frozen E never limits how context is read);
    the shared E only spans the space of z, D and the logits.
    """

    def __init__(self, config: BlockTrainConfig) -> None:
        super().__init__()
        width = config.d_model
        layer = ModelConfig(vocab_size=config.vocab, d_model=width, n_layers=config.layers_per_block,
                            n_heads=config.n_heads, context=config.context)
        self.tok = nn.Embedding(config.vocab, width)
        self.pos = nn.Embedding(config.context, width)
        self.z_in = nn.Linear(config.vocab, width)
        self.noise = nn.Sequential(nn.Linear(1, width), nn.SiLU(), nn.Linear(width, width))
        self.layers = nn.ModuleList(_Block(layer) for _ in range(config.layers_per_block))
        self.norm_f = nn.LayerNorm(width)
        self.out = nn.Linear(width, width)
        self.gain = nn.Linear(width, 1)

    def forward(
        self, context: torch.Tensor, z_in: torch.Tensor, c_noise: torch.Tensor, evidence: torch.Tensor
    ) -> torch.Tensor:
        positions = torch.arange(context.shape[1], device=context.device)
        noise = self.noise(c_noise[:, None].to(z_in.dtype))
        h = self.tok(context) + self.pos(positions) + self.z_in(evidence) + noise[:, None, :]
        for layer in self.layers:
            h = layer(h)
        return self.out(self.norm_f(h)) + self.gain(noise)[:, :, None] * z_in


class BlockStack(nn.Module):
    """The shared embedding ``embed`` (E) and the ``blocks`` (one ``_Denoiser`` per noise band).

    Build it with ``build_stack``. Parameter names inside a block (``block_state``) are relative
    to the block, e.g. ``layers.0.attn.qkv.weight``, so a block checkpoint fits any stack slot.
    """

    def __init__(self, config: BlockTrainConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.d_model)
        self.blocks = nn.ModuleList(_Denoiser(config) for _ in range(config.num_blocks))

    def block_state(self, k: int) -> dict[str, torch.Tensor]:
        """Detached copies of block k's parameters, by name relative to the block."""
        check_block(self.config, k)
        return {name: param.detach().clone() for name, param in self.blocks[k].named_parameters()}

    def load_block_state(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        """Replace block k's parameters; refuses missing/extra names, bad shapes, non-finite values."""
        check_block(self.config, k)
        _load_checked(dict(self.blocks[k].named_parameters()), state, what=f"block {k} state")

    def embedding_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of E as ``{"weight": [vocab, d_model]}``."""
        return {"weight": self.embed.weight.detach().clone()}

    def load_embedding_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Replace E (same checks as ``load_block_state``)."""
        _load_checked({"weight": self.embed.weight}, state, what="embedding state")


def _load_checked(own: dict[str, nn.Parameter], state: Mapping[str, torch.Tensor], *, what: str) -> None:
    """Validate everything first, then copy: a refused state leaves the parameters untouched."""
    if not isinstance(state, Mapping):
        raise BlockTrainError(f"{what}: expected a mapping of name -> tensor, got {type(state).__name__}")
    missing, extra = sorted(own.keys() - state.keys()), sorted(str(n) for n in state.keys() - own.keys())
    if missing or extra:
        raise BlockTrainError(f"{what}: missing {missing}, unexpected {extra}")
    for name, param in own.items():
        value = state[name]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise BlockTrainError(f"{what}: {name} must be a floating-point tensor, got {type(value).__name__}")
        if tuple(value.shape) != tuple(param.shape):
            raise BlockTrainError(f"{what}: {name} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
        if not bool(torch.isfinite(value).all()):
            raise BlockTrainError(f"{what}: {name} holds NaN or Inf")
    with torch.no_grad():
        for name, param in own.items():
            param.copy_(state[name])


def _initialise(stack: BlockStack, generator: torch.Generator) -> None:
    embed = stack.embed.weight
    nn.init.normal_(embed, mean=0.0, std=1.0, generator=generator)
    embed.mul_(stack.config.sigma_data / embed.norm(dim=1, keepdim=True))
    init_transformer_weights(stack.blocks, n_layers=stack.config.layers_per_block, generator=generator)
    for block in stack.blocks:
        nn.init.zeros_(block.z_in.weight)  # a fresh block reads context only and learns how much z to trust
        nn.init.zeros_(block.gain.weight)
        # logits D E^T start at about unit scale although the rows of E have norm sigma_data
        out_std = 1.0 / (stack.config.sigma_data * math.sqrt(stack.config.d_model))
        nn.init.normal_(block.out.weight, std=out_std, generator=generator)


def build_stack(config: BlockTrainConfig, *, seed: int, device: torch.device | str) -> BlockStack:
    """A freshly initialised stack; the same seed gives the same E and blocks on the same device.

    E: random directions with row norm sigma_data; block weights: GPT-2 init (std 0.02, residual
    projections / sqrt(2 layers_per_block)), the z-input and gain paths zero (a fresh block reads
    context only). The global RNG is neither read nor advanced.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise BlockTrainError(f"seed: must be a non-negative integer, got {seed!r}")
    target = torch.device(device)
    with torch.device("meta"):
        stack = BlockStack(config)
    stack.to_empty(device=target)
    generator = torch.Generator(device=target).manual_seed(seed)
    with torch.no_grad():
        _initialise(stack, generator)
    stack.embed.weight.requires_grad_(config.embedding == "averaged")
    return stack


def block_parameters(stack: BlockStack, k: int) -> list[nn.Parameter]:
    """What block k's optimizer holds: the block's parameters, plus E when it is averaged."""
    check_block(stack.config, k)
    params = list(stack.blocks[k].parameters())
    return [*params, stack.embed.weight] if stack.config.embedding == "averaged" else params


def check_tokens(stack: BlockStack, name: str, tokens: Any) -> None:
    """BlockTrainError unless ``tokens`` is an int64 [batch, T] tensor of ids < vocab, 1 <= T <= context."""
    config = stack.config
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int64 or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise BlockTrainError(f"{name}: expected an int64 tensor [batch, T], got {shape}")
    if not 1 <= tokens.shape[1] <= config.context:
        raise BlockTrainError(f"{name}: length {tokens.shape[1]} is outside [1, {config.context}]")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= config.vocab):
        raise BlockTrainError(f"{name}: token ids must lie in [0, {config.vocab})")


def target_embedding(stack: BlockStack) -> torch.Tensor:
    """E with every row rescaled to L2 norm sigma_data: the clean targets E[y] and the logit basis.

    Rescaling (rather than trusting E's own scale) fixes the signal-to-noise ratio of each band:
    a block cannot make its noisy targets easier to read by growing E when E is trained.
    """
    weight = stack.embed.weight
    return stack.config.sigma_data * weight / weight.norm(dim=1, keepdim=True).clamp_min(1e-12)


def denoise(stack: BlockStack, k: int, context: torch.Tensor, z: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """D = c_skip z + c_out block_k(context, c_in z, c_noise) at per-sequence noise ``sigma`` [batch]: [batch, T, d]."""
    if not isinstance(sigma, torch.Tensor) or tuple(sigma.shape) != (z.shape[0],):
        got = tuple(sigma.shape) if isinstance(sigma, torch.Tensor) else type(sigma).__name__
        raise BlockTrainError(f"sigma: expected one noise level per sequence, shape ({z.shape[0]},), got {got}")
    coeff = edm_coefficients(sigma.to(z.dtype), stack.config.sigma_data)
    evidence = torch.softmax(F.linear(z, target_embedding(stack).detach()) / sigma[:, None, None] ** 2, dim=-1)
    out = stack.blocks[k](context, coeff.c_in[:, None, None] * z, coeff.c_noise, evidence)
    return coeff.c_skip[:, None, None] * z + coeff.c_out[:, None, None] * out

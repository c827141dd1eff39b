"""BlockTrain: a byte-level LM split into B blocks, each a denoiser trained on its own noise band.

**Model.** ``BlockStack`` holds the shared byte embedding E (``embed``, [vocab, d_model]) and
``num_blocks`` denoisers. Block k is a small causal transformer that owns one band
[edges[k], edges[k+1]] of noise levels; the bands split a log-normal(p_mean, p_std) restricted to
sigma in [sigma_min, sigma_max] into equal-probability parts (``band_edges``; for the defaults and
B = 4: 1.000, 1.238, 1.623, 2.428, 10.000). Block 0 owns the lowest noise.

**Training block k** (``train_step``; nothing outside block k is touched). For context bytes x
[batch, T] and targets y (y_t = x_{t+1}): draw one sigma per sequence from block k's band, form the
noisy target embedding z = E[y] + sigma * eps and, with EDM preconditioning (sigma_d = sigma_data),
c_skip = sigma_d^2 / (sigma^2 + sigma_d^2), c_out = sigma sigma_d / sqrt(sigma^2 + sigma_d^2),
c_in = 1 / sqrt(sigma^2 + sigma_d^2), c_noise = ln(sigma) / 4::

    F = block_k(x, c_in z, c_noise)     # position t sees x_<=t and z_<=t only (causal mask)
    D = c_skip z + c_out F              # denoised estimate
    loss = mean over sequences of lambda(sigma) * CE(D E^T, y),  lambda = (sigma^2 + sigma_d^2) / (sigma sigma_d)^2

z_t' for t' <= t are noisy copies of bytes x_<=t+1, so no position sees a byte it must predict.
Inside a block: its own context embedding and positions, a noise-level embedding of c_noise, and
z read as *evidence* p(y | z) = softmax(z E^T / sigma^2) (the Bayes posterior of the byte from z
alone, a function of c_in z and c_noise); F also has a noise-dependent linear path from c_in z.
Reading z through the evidence matters: fed raw, the noise in z dominates a fresh block's input.

**Shared embedding.** The rows of E have L2 norm sigma_data (``target_embedding`` rescales them,
so E's scale never drifts). With d_model = 128 this keeps the bands honest: at sigma = 1 the
noisy target tells little about the byte (the blocks must still model the context), while at
sigma = 0.002 it gives the byte away (the target-leakage failure). Default ``embedding =
"frozen"``: E is drawn from the run seed and never trained, so every worker of every block derives
the same E without exchanging it, a step touches exactly one block, and no block's targets move
under another block's feet. ``"averaged"``: E is also in every block's optimizer (through the
logits; z and the evidence use E detached) and the network averages the copies across all block
workers (``embedding_state`` / ``load_embedding_state``).

**Inference** (one traversal, ``traverse``): z starts as sigma_max * N(0, I) at every position
(``initial_noise``); blocks run from B-1 (highest band) down to 0, each taking ONE Euler step of the
probability-flow ODE dz/dsigma = (z - x0_hat) / sigma on all positions at once (``denoise_step``):
block k evaluates at sigma_hi = edges[k+1] and steps to sigma_lo = edges[k]. The clean estimate
x0_hat is the block's expected embedding softmax(D E^T) E (D is trained through a cross-entropy,
so it is a logit direction, not a point near E[y]; stepping with raw D overshoots). Block 0 steps
to sigma = 0, where the Euler update lands on the estimate itself; it returns D, so the final z IS
the last block's output and ``readout`` gives its logits D E^T for every position, with the clean
context (teacher forcing), in one traversal.

**Open-ended generation** (``generate``): future context bytes are unknown, so generation works
on segments of up to context // 2 new bytes. A segment starts with every new byte set to a space
(the commonest byte of text) and runs ``traversals`` traversals over committed prefix + provisional
bytes. Traversal i (from 0) draws byte i from its logits, which were computed from a fully
committed prefix, exactly as autoregressive sampling would, and commits it; the bytes after it
become drafts for the next traversal: their argmax (drafts drawn at temperature compound their
errors), and in the last traversal they are drawn at the temperature and kept.
``traversals >= segment length`` is exact autoregressive sampling; fewer traversals trade quality
for fewer traversals (``scripts/experiments/blocktrain.py`` measures how much).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.errors import ProtocolError
from gossamer.protocols.models import ModelConfig, _Block, init_transformer_weights
from gossamer.protocols.tables import table_kwargs

EMBEDDINGS = ("frozen", "averaged")
PLACEHOLDER_BYTE = 0x20
"""What ``generate`` puts in the not-yet-known context positions before the first traversal."""


class BlockTrainError(ProtocolError, ValueError):
    """A bad BlockTrain setting, tensor or state; the message names the field or value."""


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BlockTrainError(f"{name}: must be a positive integer, got {value!r}")


def _finite(name: str, value: Any, *, positive: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        kind = "a finite number > 0" if positive else "a finite number"
        raise BlockTrainError(f"{name}: must be {kind}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class BlockTrainConfig:
    """Shape of a block stack and its noise schedule (the run manifest's BlockTrain table)."""

    vocab: int = 256  # token ids (bytes: 256)
    d_model: int = 128  # width of every block and of the embedding E
    n_heads: int = 4  # attention heads per layer; must divide d_model
    context: int = 64  # longest sequence a block accepts (positional table size)
    num_blocks: int = 4  # B: blocks, one noise band each
    layers_per_block: int = 1  # transformer layers inside one block
    sigma_min: float = 1.0  # lowest training noise level
    sigma_max: float = 10.0  # highest noise level; inference starts here
    p_mean: float = -1.2  # log-normal mean of ln(sigma)
    p_std: float = 1.2  # log-normal std of ln(sigma)
    sigma_data: float = 0.5  # EDM sigma_d; also the L2 norm of every row of E (the clean targets)
    embedding: str = "frozen"  # "frozen" (never trained) or "averaged" (trained, averaged by the network)

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "n_heads", "context", "num_blocks", "layers_per_block"):
            _positive_int(name, getattr(self, name))
        if self.vocab < 2:
            raise BlockTrainError(f"vocab: must be at least 2, got {self.vocab}")
        if self.d_model % self.n_heads:
            raise BlockTrainError(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")
        for name in ("sigma_min", "sigma_max", "p_std", "sigma_data"):
            _finite(name, getattr(self, name), positive=True)
        _finite("p_mean", self.p_mean)
        if not self.sigma_min < self.sigma_max:
            raise BlockTrainError(f"sigma_min: {self.sigma_min} must be below sigma_max={self.sigma_max}")
        if self.embedding not in EMBEDDINGS:
            raise BlockTrainError(f"embedding: must be one of {list(EMBEDDINGS)}, got {self.embedding!r}")
        for name in ("sigma_min", "sigma_max", "p_mean", "p_std", "sigma_data"):
            object.__setattr__(self, name, float(getattr(self, name)))
        band_edges(self)  # refuses a range that carries no probability mass

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BlockTrainConfig:
        """Build from a manifest table (any subset of the fields); unknown keys are refused."""
        return cls(**table_kwargs(cls, d, what="blocktrain", error=BlockTrainError))

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (the inverse of ``from_dict``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------- noise schedule and EDM


def _band_quantiles(config: BlockTrainConfig, fractions: torch.Tensor) -> torch.Tensor:
    """sigma at the given fractions (float64, in [0, 1]) of the truncated log-normal's mass.

    Works on whichever tail of the normal keeps precision (survival function above the median).
    """
    a = (math.log(config.sigma_min) - config.p_mean) / config.p_std
    b = (math.log(config.sigma_max) - config.p_mean) / config.p_std
    ndtr = torch.special.ndtr
    if a >= 0:  # upper tail: interpolate survival probabilities S(x) = ndtr(-x)
        s_a, s_b = ndtr(torch.tensor(-a, dtype=torch.float64)), ndtr(torch.tensor(-b, dtype=torch.float64))
        x = -torch.special.ndtri(s_a - fractions * (s_a - s_b))
    else:
        p_a, p_b = ndtr(torch.tensor(a, dtype=torch.float64)), ndtr(torch.tensor(b, dtype=torch.float64))
        x = torch.special.ndtri(p_a + fractions * (p_b - p_a))
    sigma = torch.exp(config.p_mean + config.p_std * x)
    return sigma.clamp(config.sigma_min, config.sigma_max)


def band_edges(config: BlockTrainConfig) -> list[float]:
    """num_blocks + 1 increasing edges; band k = [edges[k], edges[k+1]] has 1/num_blocks of the mass."""
    fractions = torch.arange(config.num_blocks + 1, dtype=torch.float64) / config.num_blocks
    edges = _band_quantiles(config, fractions).tolist()
    edges[0], edges[-1] = config.sigma_min, config.sigma_max
    if not all(lo < hi for lo, hi in itertools.pairwise(edges)):
        raise BlockTrainError(
            f"sigma_min/sigma_max: [{config.sigma_min}, {config.sigma_max}] holds too little mass of "
            f"log-normal({config.p_mean}, {config.p_std}) to split into {config.num_blocks} bands"
        )
    return edges


def _check_block(config: BlockTrainConfig, k: Any) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < config.num_blocks:
        raise BlockTrainError(f"block: must be an int in [0, {config.num_blocks}), got {k!r}")


def sample_sigma(config: BlockTrainConfig, k: int, count: int, *, generator: torch.Generator) -> torch.Tensor:
    """``count`` noise levels from block k's band of the truncated log-normal (float64, generator's device)."""
    _check_block(config, k)
    u = torch.rand(count, dtype=torch.float64, generator=generator, device=generator.device)
    fractions = (k + u.cpu()) / config.num_blocks
    edges = band_edges(config)
    return _band_quantiles(config, fractions).clamp(edges[k], edges[k + 1]).to(generator.device)


@dataclass(frozen=True)
class EdmCoefficients:
    """EDM preconditioning at noise level(s) sigma (Karras et al. 2022, table 1)."""

    c_skip: torch.Tensor
    c_out: torch.Tensor
    c_in: torch.Tensor
    c_noise: torch.Tensor


def edm_coefficients(sigma: torch.Tensor, sigma_data: float) -> EdmCoefficients:
    """c_skip, c_out, c_in, c_noise for each sigma (same shape and dtype as ``sigma``)."""
    total = sigma**2 + sigma_data**2
    return EdmCoefficients(
        c_skip=sigma_data**2 / total,
        c_out=sigma * sigma_data / total.sqrt(),
        c_in=1.0 / total.sqrt(),
        c_noise=sigma.log() / 4.0,
    )


def loss_weight(sigma: torch.Tensor, sigma_data: float) -> torch.Tensor:
    """lambda(sigma) = (sigma^2 + sigma_d^2) / (sigma sigma_d)^2 = 1 / c_out^2."""
    return (sigma**2 + sigma_data**2) / (sigma * sigma_data) ** 2


# ---------------------------------------------------------------- the stack


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
        _check_block(self.config, k)
        return {name: param.detach().clone() for name, param in self.blocks[k].named_parameters()}

    def load_block_state(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        """Replace block k's parameters; refuses missing/extra names, bad shapes, non-finite values."""
        _check_block(self.config, k)
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
    _check_block(stack.config, k)
    params = list(stack.blocks[k].parameters())
    return [*params, stack.embed.weight] if stack.config.embedding == "averaged" else params


# ---------------------------------------------------------------- training


def _check_tokens(stack: BlockStack, name: str, tokens: Any) -> None:
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


@dataclass(frozen=True)
class BlockLoss:
    """One batch's objective: ``loss`` (lambda-weighted, what is optimised) and plain ``ce`` (nats)."""

    loss: torch.Tensor
    ce: torch.Tensor


def block_loss(
    stack: BlockStack, k: int, context: torch.Tensor, targets: torch.Tensor, *, generator: torch.Generator
) -> BlockLoss:
    """Block k's denoising objective on one batch (one sigma per sequence, drawn in block k's band)."""
    _check_block(stack.config, k)
    _check_tokens(stack, "context", context)
    _check_tokens(stack, "targets", targets)
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
    _check_block(stack.config, k)
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


# ---------------------------------------------------------------- inference


def initial_noise(
    config: BlockTrainConfig, shape: tuple[int, int], *, generator: torch.Generator, device: torch.device | str
) -> torch.Tensor:
    """z at sigma_max for [batch, T] positions: sigma_max * N(0, I), shape [batch, T, d_model]."""
    if len(shape) != 2 or not all(isinstance(n, int) and n >= 1 for n in shape):
        raise BlockTrainError(f"shape: expected (batch, T) of positive ints, got {shape!r}")
    eps = torch.randn((*shape, config.d_model), generator=generator, device=generator.device)
    return config.sigma_max * eps.to(device)


@torch.no_grad()
def denoise_step(stack: BlockStack, k: int, context: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Block k's Euler step on all positions: z at edges[k+1] -> z at edges[k] (block 0: -> sigma 0)."""
    _check_block(stack.config, k)
    _check_tokens(stack, "context", context)
    expected = (*context.shape, stack.config.d_model)
    if not isinstance(z, torch.Tensor) or tuple(z.shape) != expected or not z.is_floating_point():
        got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise BlockTrainError(f"z: expected a float tensor of shape {expected}, got {got}")
    edges = band_edges(stack.config)
    sigma_hi = edges[k + 1]
    sigma = torch.full((z.shape[0],), sigma_hi, dtype=z.dtype, device=z.device)
    denoised = denoise(stack, k, context, z, sigma)
    if k == 0:
        return denoised
    embedding = target_embedding(stack)
    expected = torch.softmax(F.linear(denoised, embedding).float(), dim=-1).to(z.dtype) @ embedding
    return z + (edges[k] - sigma_hi) * (z - expected) / sigma_hi


@torch.no_grad()
def readout(stack: BlockStack, z: torch.Tensor) -> torch.Tensor:
    """Logits z E^T [batch, T, vocab] from the final z (= block 0's denoised estimate D)."""
    if not isinstance(z, torch.Tensor) or z.dim() != 3 or z.shape[-1] != stack.config.d_model:
        got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise BlockTrainError(f"z: expected [batch, T, {stack.config.d_model}], got {got}")
    return F.linear(z, target_embedding(stack))


@torch.no_grad()
def traverse(stack: BlockStack, context: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
    """One traversal in one process: initial noise, blocks B-1 .. 0, readout -> logits [batch, T, vocab]."""
    _check_tokens(stack, "context", context)
    z = initial_noise(stack.config, tuple(context.shape), generator=generator, device=context.device)
    for k in reversed(range(stack.config.num_blocks)):
        z = denoise_step(stack, k, context, z)
    return readout(stack, z)


@torch.no_grad()
def heldout_ce(stack: BlockStack, data: bytes, *, batches: int, batch_size: int, generator: torch.Generator) -> float:
    """Mean next-byte cross-entropy (nats) after one full traversal, on evenly spaced windows of ``data``."""
    _positive_int("batches", batches)
    _positive_int("batch_size", batch_size)
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
        logits = traverse(stack, window[:, :-1], generator=generator)
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten(), reduction="sum"))
    return total / (count * context)


def _draw(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1).to(generator.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


def update_segment(
    window: torch.Tensor,
    logits: torch.Tensor,
    *,
    start: int,
    committed: int,
    last: bool,
    temperature: float,
    generator: torch.Generator,
) -> None:
    """One traversal's update of a generation segment, in place (shared with remote generation).

    ``window`` [1, start + count] holds the committed prefix and the segment's ``count`` bytes;
    ``logits`` [count, vocab] are the traversal's logits for them. Byte ``committed`` is drawn
    alone (it saw a fully committed prefix); the later bytes become the argmax drafts, or, in the
    ``last`` traversal, are drawn too.
    """
    window[0, start + committed] = _draw(logits[committed : committed + 1], temperature, generator)[0]
    rest = logits[committed + 1 :]
    if rest.shape[0]:
        window[0, start + committed + 1 :] = _draw(rest, temperature, generator) if last else rest.argmax(-1)


def generation_steps(
    config: BlockTrainConfig,
    prompt: bytes,
    *,
    new_bytes: int,
    traversals: int,
    generator: torch.Generator,
    temperature: float = 1.0,
    device: torch.device | str = "cpu",
) -> Generator[torch.Tensor, torch.Tensor, bytes]:
    """Generation without the traversals (sans-I/O): yields each context window [1, T] to traverse,
    takes that traversal's logits [1, T, vocab] back through ``send``, and returns the new bytes.

    Whoever runs the traversals drives it: ``generate`` in one process, ``peer.roles.blocktrain.client``
    through block servers, so the segment loop (see the module doc) exists once and both draw from
    ``generator`` in the same order (a traversal draws its initial noise, then ``update_segment``).
    ``temperature == 0`` is greedy. BlockTrainError for a bad request, at the first ``next``.
    """
    if config.vocab != 256:
        raise BlockTrainError(f"vocab: generate needs a byte vocabulary (256), got {config.vocab}")
    if not isinstance(prompt, bytes | bytearray) or not prompt:
        raise BlockTrainError("prompt: must be at least one byte")
    if not isinstance(new_bytes, int) or isinstance(new_bytes, bool) or new_bytes < 0:
        raise BlockTrainError(f"new_bytes: must be a non-negative integer, got {new_bytes!r}")
    _positive_int("traversals", traversals)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not temperature >= 0:
        raise BlockTrainError(f"temperature: must be a number >= 0, got {temperature!r}")
    sequence = bytearray(prompt)
    span = max(1, config.context // 2)
    while len(sequence) < len(prompt) + new_bytes:
        count = min(span, len(prompt) + new_bytes - len(sequence))
        prefix = list(sequence[-(config.context - count + 1) :])
        window = torch.tensor([prefix + [PLACEHOLDER_BYTE] * count], dtype=torch.long, device=device)
        rounds = min(traversals, count)
        for committed in range(rounds):
            logits = (yield window[:, :-1])[0, len(prefix) - 1 :]
            update_segment(window, logits, start=len(prefix), committed=committed, last=committed == rounds - 1,
                           temperature=temperature, generator=generator)
        sequence += bytes(window[0, len(prefix) :].tolist())
    return bytes(sequence[len(prompt) :])


@torch.no_grad()
def generate(
    stack: BlockStack,
    prompt: bytes,
    *,
    new_bytes: int,
    traversals: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> bytes:
    """Continue ``prompt`` by ``new_bytes`` bytes, ``traversals`` traversals per segment, in one
    process (``generation_steps`` driven by ``traverse``)."""
    steps = generation_steps(stack.config, prompt, new_bytes=new_bytes, traversals=traversals, generator=generator,
                             temperature=temperature, device=stack.embed.weight.device)
    try:
        window = next(steps)
        while True:
            window = steps.send(traverse(stack, window, generator=generator))
    except StopIteration as done:
        return done.value

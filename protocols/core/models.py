"""The small byte-level causal transformer LM every text protocol reuses, and ``ModelConfig``, its
shape (the manifest's ``[model]`` table). Parameter names are part of the API (README.md of
protocols/core, "The byte-level transformer"); initialisation never touches the global RNG. The
data helpers of ``text_data`` are re-exported here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import check, read_table, setting
from gossamer.protocols.core.text_data import (
    BatchSampler,
    TextSplit,
    evaluate,
    load_text,
    next_byte_loss,
    shard,
    split_text,
    train_steps,
)

__all__ = [
    "BatchSampler",
    "ByteTransformer",
    "ModelConfig",
    "TextSplit",
    "build_initialised",
    "build_model",
    "evaluate",
    "flat_parameters",
    "generate",
    "init_transformer_weights",
    "load_parameters",
    "load_text",
    "next_byte_loss",
    "parameter_groups",
    "shard",
    "split_text",
    "train_steps",
]

INIT_STD = 0.02
M = TypeVar("M", bound="ByteTransformer")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a ``ByteTransformer``; the run manifest's ``[model]`` table maps onto it. Subclasses
    (FoMoE's ``MoEConfig``) call ``super().__post_init__()`` first, then check their own fields."""

    vocab_size: int = setting(256, low=2, doc="number of token ids (bytes: 256)")
    d_model: int = setting(128, low=1, doc="width of the residual stream; a multiple of n_heads")
    n_layers: int = setting(2, low=1, doc="number of transformer blocks")
    n_heads: int = setting(4, low=1, doc="attention heads per block; must divide d_model")
    context: int = setting(128, low=1, doc="longest sequence the model accepts (positional table size)")
    mlp_ratio: int = setting(4, low=1, doc="MLP hidden width = mlp_ratio * d_model")
    dropout: float = setting(0.0, low=0.0, below=1.0,
                             doc="dropout on attention and residual branches (0: none, and no RNG use)")
    tie_embeddings: bool = setting(True, doc="the output head shares the input embedding matrix")

    def __post_init__(self) -> None:
        check(self)
        if self.d_model % self.n_heads:
            raise InvalidSetting(f"d_model: {self.d_model} is not divisible by n_heads={self.n_heads}")

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> ModelConfig:
        """Build from a subset of the field names (e.g. a manifest table); unknown keys are refused."""
        return read_table(cls, table, path="model")

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (the inverse of ``from_dict``)."""
        return asdict(self)


class _Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, width // self.n_heads).unbind(2)
        dropout_p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p, is_causal=True
        )
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


class _MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def _dropout(p: float) -> nn.Module:
    return nn.Dropout(p) if p > 0 else nn.Identity()


class _Block(nn.Module):
    """Pre-LayerNorm block; ``mlp`` is the feed-forward part (a ``_MLP`` unless the caller gives
    another module, e.g. FoMoE's mixture of experts, which keeps the ``blocks.{i}.mlp.*`` names)."""

    def __init__(self, config: ModelConfig, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = _Attention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = _MLP(config) if mlp is None else mlp
        self.drop = _dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class ByteTransformer(nn.Module):
    """Causal byte LM: ``forward(tokens[B, T]) -> logits[B, T, vocab_size]`` with T <= context.

    Construct it through ``build_model``; the constructor leaves parameters uninitialised
    when built on the meta device.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.context, config.d_model)
        self.drop = _dropout(config.dropout)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.d_model)
        self.head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for block in self.blocks:
            x = block(x)
        return self.readout(x)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The residual stream entering block 0: token plus position embeddings, [B, T, d_model]."""
        if tokens.dim() != 2:
            raise InvalidSetting(f"tokens: expected shape [batch, length], got {tuple(tokens.shape)}")
        length = tokens.shape[1]
        if not 1 <= length <= self.config.context:
            raise InvalidSetting(f"context: sequence length {length} is outside [1, {self.config.context}]")
        positions = torch.arange(length, device=tokens.device)
        return self.drop(self.embed(tokens) + self.pos(positions))

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from the residual stream leaving the last block (final norm, then the head)."""
        x = self.norm_f(x)
        if self.head is None:
            return F.linear(x, self.embed.weight)
        return self.head(x)


def init_transformer_weights(root: nn.Module, *, n_layers: int, generator: torch.Generator) -> None:
    """GPT-2 style initialisation of every LayerNorm, Linear and Embedding under ``root``: N(0, 0.02),
    residual projections (``*.proj``) scaled by 1/sqrt(2 n_layers), zero biases, unit norms."""
    residual_std = INIT_STD / math.sqrt(2 * n_layers)
    for name, module in root.named_modules():
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear | nn.Embedding):
            std = residual_std if name.endswith(".proj") else INIT_STD
            nn.init.normal_(module.weight, mean=0.0, std=std, generator=generator)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


def build_model(config: ModelConfig, *, seed: int, device: torch.device | str = "cpu") -> ByteTransformer:
    """A freshly initialised model: GPT-2 init (std 0.02, residual projections / sqrt(2 n_layers)).

    The same seed gives bitwise identical parameters on the same device; the global RNG is
    neither read nor advanced.
    """
    return build_initialised(ByteTransformer, config, seed=seed, device=device)


def build_initialised(cls: type[M], config: ModelConfig, *, seed: int, device: torch.device | str = "cpu") -> M:
    """``cls(config)`` built on the meta device, then filled on ``device`` by
    ``init_transformer_weights`` from a generator seeded with ``seed`` (for subclasses of
    ``ByteTransformer`` that keep its conventions, e.g. FoMoE's ``MoETransformer``)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InvalidSetting(f"seed: must be a non-negative integer, got {seed!r}")
    target = torch.device(device)
    with torch.device("meta"):
        model = cls(config)
    model.to_empty(device=target)
    generator = torch.Generator(device=target)
    generator.manual_seed(seed)
    with torch.no_grad():
        init_transformer_weights(model, n_layers=config.n_layers, generator=generator)
    return model


def parameter_groups(model: ByteTransformer) -> dict[str, list[str]]:
    """Parameter names by group: ``embeddings``, ``layer0`` .. ``layer{n-1}``, ``head``.

    Every parameter is in exactly one group; used to restrict mixing to a subset of the model.
    """
    groups: dict[str, list[str]] = {"embeddings": []}
    groups.update({f"layer{i}": [] for i in range(len(model.blocks))})
    groups["head"] = []
    for name, _ in model.named_parameters():
        if name.startswith(("embed.", "pos.")):
            groups["embeddings"].append(name)
        elif name.startswith("blocks."):
            groups[f"layer{name.split('.')[1]}"].append(name)
        else:
            assert name.startswith(("norm_f.", "head.")), name
            groups["head"].append(name)
    return groups


def flat_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of every parameter, by name (tied weights appear once)."""
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def load_parameters(model: nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """Copy ``params`` into the model in place; names and shapes must match exactly."""
    own = dict(model.named_parameters())
    missing, extra = sorted(own.keys() - params.keys()), sorted(params.keys() - own.keys())
    if missing or extra:
        raise InvalidSetting(f"params: missing {missing}, unexpected {extra}")
    for name, param in own.items():
        if tuple(params[name].shape) != tuple(param.shape):
            raise InvalidSetting(f"params: {name} has shape {tuple(params[name].shape)}, expected {tuple(param.shape)}")
    with torch.no_grad():
        for name, param in own.items():
            param.copy_(params[name])


def _next_byte(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature == 0:
        return int(logits.argmax())
    assert generator is not None
    probs = torch.softmax(logits.float() / temperature, dim=-1).to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(
    model: ByteTransformer,
    prompt: bytes,
    *,
    max_new_bytes: int,
    temperature: float = 0.8,
    generator: torch.Generator | None = None,
) -> bytes:
    """Continue ``prompt`` by ``max_new_bytes`` bytes, conditioning on the last ``context`` bytes.

    ``temperature == 0`` is greedy; otherwise sampling draws from ``generator`` (required; it may
    live on any device), so a seeded generator gives a repeatable continuation.
    """
    if model.config.vocab_size != 256:
        raise InvalidSetting(f"vocab_size: generate needs a byte vocabulary (256), got {model.config.vocab_size}")
    if not prompt:
        raise InvalidSetting("prompt: must contain at least one byte")
    if not isinstance(max_new_bytes, int) or max_new_bytes < 0:
        raise InvalidSetting(f"max_new_bytes: must be a non-negative integer, got {max_new_bytes!r}")
    if not temperature >= 0:
        raise InvalidSetting(f"temperature: must be >= 0, got {temperature!r}")
    if temperature > 0 and generator is None:
        raise InvalidSetting("generator: required when temperature > 0 (protocols never use the global RNG)")
    device = model.embed.weight.device
    sequence = list(prompt)
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_bytes):
            window = torch.tensor([sequence[-model.config.context :]], dtype=torch.long, device=device)
            sequence.append(_next_byte(model(window)[0, -1], temperature, generator))
    finally:
        model.train(was_training)
    return bytes(sequence[len(prompt) :])

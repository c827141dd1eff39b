"""The context-parallel LM: ``build_context_model`` (a seeded ``ByteTransformer``, its attention
subspace-coded when a rank is set; its ``forward`` is the reference the ring must equal) and
``coding_of`` (what the ring needs from an attention layer).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from gossamer.protocols.context.core.config import SubspaceConfig
from gossamer.protocols.context.core.errors import InvalidRing
from gossamer.protocols.context.core.subspace import SubspaceAttention, init_bases, retract_bases
from gossamer.protocols.core.models import ByteTransformer, ModelConfig, build_model, init_transformer_weights


class KVCoding(Protocol):
    """What the ring needs from one attention layer: ``project`` (queries and the tensors a member
    sends), ``rebuild`` (keys and values from a received message) and ``coef_backward`` (what
    travels back, and the basis gradient the user of the keys keeps)."""

    n_heads: int
    d_head: int
    width: int
    mixtures: int
    proj: nn.Linear

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]: ...

    def rebuild(self, k_coef: Tensor, v_coef: Tensor, index: Tensor | None) -> tuple[Tensor, Tensor]: ...

    def coef_backward(self, k_coef: Tensor, v_coef: Tensor, index: Tensor | None, dk: Tensor,
                      dv: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]: ...


class DenseCoding:
    """``ByteTransformer``'s own attention seen as a coding: the message is K and V themselves."""

    mixtures = 1

    def __init__(self, attention: nn.Module) -> None:
        self.attention = attention
        self.n_heads = attention.n_heads
        self.d_head = attention.qkv.in_features // attention.n_heads
        self.width = self.d_head
        self.proj = attention.proj

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        batch, length, _ = x.shape
        qkv = self.attention.qkv(x).view(batch, length, 3, self.n_heads, self.d_head)
        q, k, v = (part.transpose(1, 2) for part in qkv.unbind(2))
        return q, k, v, None

    def rebuild(self, k_coef: Tensor, v_coef: Tensor, index: Tensor | None) -> tuple[Tensor, Tensor]:
        return k_coef, v_coef

    def coef_backward(self, k_coef: Tensor, v_coef: Tensor, index: Tensor | None, dk: Tensor,
                      dv: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        return dk, dv, {}


def coding_of(attention: nn.Module) -> KVCoding:
    """The ring's view of one block's attention module."""
    if isinstance(attention, SubspaceAttention):
        return attention
    if hasattr(attention, "qkv") and hasattr(attention, "proj"):
        return DenseCoding(attention)
    raise InvalidRing(f"attention: {type(attention).__name__} is neither ByteTransformer's nor SubspaceAttention")


def build_context_model(config: ModelConfig, subspace: SubspaceConfig = SubspaceConfig(), *, seed: int,
                        device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> ByteTransformer:
    """A freshly initialised model, the same parameter names and seeded meta-device initialisation
    as ``build_model`` (dense: exactly its model); subspace bases are drawn orthonormal from the same
    generator afterwards. The global RNG is neither read nor advanced."""
    subspace.check_model(config)
    if subspace.dense:
        return build_model(config, seed=seed, device=device).to(dtype)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InvalidRing(f"seed: must be a non-negative integer, got {seed!r}")
    target = torch.device(device)
    with torch.device("meta"):
        model = ByteTransformer(config)
        for block in model.blocks:
            block.attn = SubspaceAttention(config, subspace)
    model.to_empty(device=target)
    generator = torch.Generator(device=target)
    generator.manual_seed(seed)
    with torch.no_grad():
        init_transformer_weights(model, n_layers=config.n_layers, generator=generator)
        for block in model.blocks:
            init_bases(block.attn, generator)
    model = model.to(dtype)
    retract_bases(model)  # orthonormal to the precision of ``dtype``, not only of the float32 draw
    return model


def subspace_of(model: ByteTransformer) -> SubspaceConfig:
    """The coding a built model uses (read from its first block)."""
    attention = model.blocks[0].attn
    if isinstance(attention, SubspaceAttention):
        return SubspaceConfig(rank=attention.rank, mixtures=attention.mixtures)
    return SubspaceConfig()

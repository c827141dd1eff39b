"""Attention whose keys and values are coefficients in orthonormal subspaces, a mixture of M per
head (``SubspaceAttention``), and the Stiefel helpers that keep the bases orthonormal (tangent
projection, QR retraction) and fingerprint them (``basis_hash``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gossamer.protocols.context.core.config import SubspaceConfig
from gossamer.protocols.core.models import ModelConfig

BASIS_NAMES = ("k_basis", "v_basis")
HASH_DOMAIN = b"gossamer/context/basis/v1"


class SubspaceAttention(nn.Module):
    """Causal self-attention with subspace-coded keys and values: per head h and subspace m,
    K = C_K U_K[h, m]^T and V = C_V U_V[h, m]^T with C = X A (+ b); with M > 1 a gate picks m per
    token and scales the chosen coefficients by its probability. The queries stay dense."""

    def __init__(self, config: ModelConfig, subspace: SubspaceConfig) -> None:
        super().__init__()
        assert subspace.rank is not None, "dense attention is ByteTransformer's own"
        subspace.check_model(config)
        self.n_heads, self.rank, self.mixtures = config.n_heads, subspace.rank, subspace.mixtures
        self.d_head = config.d_model // config.n_heads
        self.dropout = config.dropout
        coef_width = self.n_heads * self.mixtures * self.rank
        self.q = nn.Linear(config.d_model, config.d_model)
        self.k_coef = nn.Linear(config.d_model, coef_width)
        self.v_coef = nn.Linear(config.d_model, coef_width)
        self.gate = nn.Linear(config.d_model, self.n_heads * self.mixtures) if self.mixtures > 1 else None
        self.k_basis = nn.Parameter(torch.empty(self.n_heads, self.mixtures, self.d_head, self.rank))
        self.v_basis = nn.Parameter(torch.empty(self.n_heads, self.mixtures, self.d_head, self.rank))
        self.proj = nn.Linear(config.d_model, config.d_model)

    @property
    def width(self) -> int:
        return self.rank

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """(q [B,H,T,d_head], key coefficients, value coefficients [B,H,T,r], index [B,H,T] or None)."""
        batch, length, _ = x.shape
        heads, mixtures, rank = self.n_heads, self.mixtures, self.rank
        q = self.q(x).view(batch, length, heads, self.d_head).transpose(1, 2)
        k_all = self.k_coef(x).view(batch, length, heads, mixtures, rank)
        v_all = self.v_coef(x).view(batch, length, heads, mixtures, rank)
        if self.gate is None:
            return q, k_all[..., 0, :].transpose(1, 2), v_all[..., 0, :].transpose(1, 2), None
        probs = self.gate(x).view(batch, length, heads, mixtures).softmax(dim=-1)
        index = probs.argmax(dim=-1, keepdim=True)
        weight = probs.gather(-1, index)
        pick = index.unsqueeze(-1).expand(batch, length, heads, 1, rank)
        k = k_all.gather(3, pick).squeeze(3) * weight
        v = v_all.gather(3, pick).squeeze(3) * weight
        return q, k.transpose(1, 2), v.transpose(1, 2), index.squeeze(-1).transpose(1, 2)

    def rebuild(self, k_coef: Tensor, v_coef: Tensor, index: Tensor | None) -> tuple[Tensor, Tensor]:
        """Keys and values [B,H,T,d_head] from their coefficients (exact: K = C U^T)."""
        return _expand(k_coef, index, self.k_basis), _expand(v_coef, index, self.v_basis)

    def coef_backward(self, k_coef: Tensor, v_coef: Tensor, index: Tensor | None, dk: Tensor,
                      dv: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """dC = dK U per token (r numbers: what travels back) and this block's dU = dK^T C."""
        dk_coef, dk_basis = _expand_backward(k_coef, index, self.k_basis, dk)
        dv_coef, dv_basis = _expand_backward(v_coef, index, self.v_basis, dv)
        return dk_coef, dv_coef, {"k_basis": dk_basis, "v_basis": dv_basis}

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k_coef, v_coef, index = self.project(x)
        k, v = self.rebuild(k_coef, v_coef, index)
        dropout_p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


def _masks(index: Tensor | None, mixtures: int, dtype: torch.dtype) -> Iterator[tuple[int, Tensor | None]]:
    if index is None or mixtures == 1:
        yield 0, None
        return
    for m in range(mixtures):
        yield m, (index == m).to(dtype).unsqueeze(-1)


def _expand(coef: Tensor, index: Tensor | None, basis: Tensor) -> Tensor:
    out = None
    for m, mask in _masks(index, basis.shape[1], coef.dtype):
        part = coef @ basis[:, m].transpose(-1, -2)
        part = part if mask is None else part * mask
        out = part if out is None else out + part
    assert out is not None
    return out


def _expand_backward(coef: Tensor, index: Tensor | None, basis: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    dcoef = None
    dbasis = torch.zeros_like(basis)
    for m, mask in _masks(index, basis.shape[1], coef.dtype):
        g = grad if mask is None else grad * mask
        part = g @ basis[:, m]
        dcoef = part if dcoef is None else dcoef + part
        dbasis[:, m] = torch.einsum("bhtd,bhtr->hdr", g, coef)
    assert dcoef is not None
    return dcoef, dbasis


# --- the Stiefel manifold -----------------------------------------------------------------------


def basis_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Every basis parameter (``*.k_basis``, ``*.v_basis``) by name, in model order."""
    return [(name, p) for name, p in model.named_parameters() if name.rsplit(".", 1)[-1] in BASIS_NAMES]


def _qr_positive(matrix: Tensor) -> Tensor:
    q, r = torch.linalg.qr(matrix)
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return q * signs.unsqueeze(-2)


@torch.no_grad()
def init_bases(module: SubspaceAttention, generator: torch.Generator) -> None:
    """Random orthonormal bases (QR of a Gaussian drawn from ``generator``)."""
    for basis in (module.k_basis, module.v_basis):
        gaussian = torch.randn(basis.shape, generator=generator, device=basis.device, dtype=basis.dtype)
        basis.copy_(_qr_positive(gaussian))


@torch.no_grad()
def retract_bases(model: nn.Module) -> None:
    """Map every basis back onto the Stiefel manifold: U <- Q of U = QR, with diag(R) > 0."""
    for _, basis in basis_parameters(model):
        basis.copy_(_qr_positive(basis))


@torch.no_grad()
def project_basis_grads(model: nn.Module) -> None:
    """Replace each basis gradient G by its tangent part G - U sym(U^T G) (in place)."""
    for _, basis in basis_parameters(model):
        if basis.grad is None:
            continue
        inner = basis.transpose(-1, -2) @ basis.grad
        basis.grad.sub_(basis @ (0.5 * (inner + inner.transpose(-1, -2))))


def orthonormality_error(model: nn.Module) -> float:
    """Largest |U^T U - I| entry over every basis (0.0 for a dense model)."""
    worst = 0.0
    for _, basis in basis_parameters(model):
        gram = basis.detach().transpose(-1, -2) @ basis.detach()
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        worst = max(worst, float((gram - eye).abs().max()))
    return worst


def basis_hash(attention: nn.Module, layer: int) -> str:
    """Hex fingerprint of one layer's bases (their exact bytes), or of "dense" for dense attention."""
    digest = hashlib.blake2b(HASH_DOMAIN + struct.pack("<I", layer), digest_size=16)
    if not isinstance(attention, SubspaceAttention):
        digest.update(b"dense")
        return digest.hexdigest()
    digest.update(struct.pack("<III", attention.n_heads, attention.mixtures, attention.rank))
    for basis in (attention.k_basis, attention.v_basis):
        data = basis.detach().to("cpu").contiguous()
        digest.update(str(data.dtype).encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()

"""Two-party additive secret sharing in Z_2^64 with 16 fractional bits (TL++ secure mode): fixed-point
encoding that never wraps silently, masks from a ChaCha20 keystream, share-wise public linear maps
and local truncation guarded by its failure bound. All arithmetic on the CPU (README.md, "Secret sharing")."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from gossamer.crypto.errors import CryptoError

FRAC_BITS: int = 16
SCALE: int = 1 << FRAC_BITS
MAX_ABS: float = float(2 ** (63 - FRAC_BITS) - 1)
"""Largest |x| that ``encode`` accepts: round(x * 2^16) then still fits a signed int64."""

KEY_BYTES = 32
NONCE_BYTES = 16
"""ChaCha20 nonce as pyca/cryptography takes it: 4-byte little-endian block counter + 12-byte nonce."""
_BLOCK_BYTES = 64
_WORD_BYTES = 8
_CHUNK = 1 << 16
"""Elements encoded per step: the float scratch stays in cache instead of a full-size temporary."""


class SharingError(CryptoError):
    """Bad input to secret sharing: out-of-range or non-finite value, wrong dtype/shape/party, or a
    truncation that the magnitude guard refuses."""


def encode(x: torch.Tensor) -> torch.Tensor:
    """Encode a floating tensor as ring elements round(x * 2^16) (int64, on the CPU).

    Rounds half to even. float32/float64 are scaled in their own dtype and float16/bfloat16 in
    float32: scaling by a power of two and rounding to an integer are exact there, so the result
    equals the float64 computation. Raises ``SharingError`` for a non-floating tensor, non-finite
    values, or |x| > ``MAX_ABS``.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise SharingError(f"encode: x must be a floating tensor, got {_describe(x)}")
    work = x.detach().cpu()
    if work.dtype not in (torch.float32, torch.float64):
        work = work.to(torch.float32)
    work = work.contiguous()
    _check_encodable(work)
    out = torch.empty(work.shape, dtype=torch.int64)
    flat_in, flat_out = work.view(-1), out.view(-1)
    scratch = torch.empty(min(_CHUNK, flat_in.numel()), dtype=work.dtype)
    for start in range(0, flat_in.numel(), _CHUNK):
        piece = flat_in[start:start + _CHUNK]
        scaled = scratch[: piece.numel()]
        torch.mul(piece, SCALE, out=scaled).round_()
        flat_out[start:start + _CHUNK].copy_(scaled)
    return out


def _check_encodable(x: torch.Tensor) -> None:
    """``SharingError`` naming the problem when x holds a non-finite value or |x| > MAX_ABS."""
    if x.numel() == 0:
        return
    low, high = (float(v) for v in torch.aminmax(x))
    if not (math.isfinite(low) and math.isfinite(high)):
        bad = int((~torch.isfinite(x)).sum())
        raise SharingError(f"encode: x holds {bad} non-finite value(s) (NaN or Inf)")
    largest = max(-low, high)
    if largest > MAX_ABS:
        raise SharingError(f"encode: |x| reaches {largest:.6g} > MAX_ABS = {MAX_ABS:.0f} "
                           f"(2^{63 - FRAC_BITS} - 1), the fixed-point range with {FRAC_BITS} fractional bits")


def decode(r: torch.Tensor, *, frac_bits: int = FRAC_BITS) -> torch.Tensor:
    """Ring elements (read as signed int64) -> float64 values r / 2^frac_bits, on the CPU."""
    r = _ring_tensor(r, "r")
    _check_bits(frac_bits, "frac_bits", low=0)
    return r.to(torch.float64).div_(float(1 << frac_bits))


class MaskStream:
    """Uniform masks over Z_2^64 from a ChaCha20 keystream; never a torch or numpy RNG.

    ``MaskStream()`` keys itself with 32 fresh bytes from ``os.urandom`` (what production uses).
    ``MaskStream(key=..., nonce=...)`` replays the same stream (for tests). The stream position
    carries over between calls, so consecutive draws never reuse keystream. The stream refuses to
    go past the 2^32 ChaCha20 blocks its 32-bit counter allows (256 GiB from counter 0). Not
    thread-safe: give each thread its own stream.
    """

    def __init__(self, key: bytes | None = None, nonce: bytes | None = None) -> None:
        key = os.urandom(KEY_BYTES) if key is None else key
        nonce = bytes(NONCE_BYTES) if nonce is None else nonce
        for name, value, size in (("key", key, KEY_BYTES), ("nonce", nonce, NONCE_BYTES)):
            if not isinstance(value, bytes) or len(value) != size:
                raise SharingError(f"MaskStream: {name} must be {size} bytes, got {_describe(value)}")
        self._encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        self._bytes_left = ((1 << 32) - int.from_bytes(nonce[:4], "little")) * _BLOCK_BYTES

    def raw_bytes(self, n: int) -> bytes:
        """The next ``n`` bytes of the keystream."""
        self._take(n)
        return self._encryptor.update(bytes(n))

    def ring(self, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """A CPU int64 tensor of ``shape``, uniform over Z_2^64: the next 8 * numel keystream bytes
        read as little-endian int64 words."""
        shape = _check_shape(shape)
        buffer = bytearray(_WORD_BYTES * math.prod(shape))
        self._take(len(buffer))
        self._encryptor.update_into(buffer, buffer)  # ChaCha20 over zero bytes = the keystream
        words = np.frombuffer(buffer, dtype="<i8").astype(np.int64, copy=False)
        return torch.from_numpy(words).reshape(shape)

    def _take(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise SharingError(f"MaskStream: byte count must be a non-negative int, got {n!r}")
        if n > self._bytes_left:
            raise SharingError(f"MaskStream: keystream exhausted ({self._bytes_left} bytes left, "
                               f"{n} asked); use a fresh MaskStream")
        self._bytes_left -= n


def share(x_ring: torch.Tensor, masks: MaskStream) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ring elements into (s0, s1) with s0 + s1 == x_ring mod 2^64: s1 = a fresh mask r,
    s0 = x_ring - r. s0 goes to party 0 (orchestrator), s1 to party 1 (helper)."""
    x_ring = _ring_tensor(x_ring, "x_ring")
    mask = masks.ring(x_ring.shape)
    return x_ring - mask, mask


def share_float(x: torch.Tensor, masks: MaskStream) -> tuple[torch.Tensor, torch.Tensor]:
    """``share(encode(x), masks)``, subtracting the mask in place in the fresh encoding."""
    encoded = encode(x)
    mask = masks.ring(encoded.shape)
    return encoded.sub_(mask), mask


def reconstruct(s0: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
    """The secret s0 + s1 (mod 2^64) as ring elements."""
    s0, s1 = _ring_tensor(s0, "s0"), _ring_tensor(s1, "s1")
    _check_same_shape(s0, s1, "s0", "s1")
    return s0 + s1


def reconstruct_float(s0: torch.Tensor, s1: torch.Tensor, *, frac_bits: int = FRAC_BITS) -> torch.Tensor:
    """``decode(reconstruct(s0, s1))``: the secret as float64."""
    return decode(reconstruct(s0, s1), frac_bits=frac_bits)


def add_public(s: torch.Tensor, public_ring: torch.Tensor, *, party: int) -> torch.Tensor:
    """One party's share of x + c for a public ring constant c (broadcast to s's shape): party 0
    adds c, party 1 returns a copy of its share unchanged, so c is counted exactly once."""
    _check_party(party)
    s, public_ring = _ring_tensor(s, "s"), _ring_tensor(public_ring, "public_ring")
    try:
        broadcast = torch.broadcast_shapes(s.shape, public_ring.shape)
    except RuntimeError:
        broadcast = None
    if broadcast != s.shape:
        raise SharingError(f"add_public: public_ring of shape {tuple(public_ring.shape)} does not "
                           f"broadcast to the share's shape {tuple(s.shape)}")
    return s + public_ring if party == 0 else s.clone()


def matmul_public(s: torch.Tensor, public: torch.Tensor) -> torch.Tensor:
    """One party's share of x @ P for a public float matrix P ([k, m]) and a share s ([..., k]).

    The result carries 2 * FRAC_BITS fractional bits: ``truncate`` it before further use.
    """
    s = _ring_tensor(s, "s")
    if not isinstance(public, torch.Tensor) or public.dim() != 2:
        raise SharingError(f"matmul_public: public must be a 2-D tensor [k, m], got {_describe(public)}")
    if s.dim() < 1 or s.shape[-1] != public.shape[0]:
        raise SharingError(f"matmul_public: share of shape {tuple(s.shape)} cannot multiply public "
                           f"of shape {tuple(public.shape)} (last dim must equal {public.shape[0]})")
    return s @ encode(public)


def truncate(s: torch.Tensor, *, party: int, bits: int = FRAC_BITS) -> torch.Tensor:
    """One party's local truncation by ``bits`` (SecureML): party 0: s >> bits (arithmetic),
    party 1: -((-s) >> bits).

    After both parties truncate, the shares reconstruct to floor(x / 2^bits) or one more, except
    with probability |x| / 2^64 per element (x at the product's scale), when the result is off by
    about 2^(64 - bits). Guard the magnitude first with ``check_truncation_safe``.
    """
    _check_party(party)
    s = _ring_tensor(s, "s")
    _check_bits(bits, "bits", low=1)
    return s >> bits if party == 0 else -((-s) >> bits)


def truncation_failure_bound(max_abs: float, numel: int, *, frac_bits: int = FRAC_BITS) -> float:
    """Upper bound on the probability that any of ``numel`` truncations fails, for plaintext products
    |x| <= max_abs in real units (at scale 2^(2 * frac_bits) before truncation):
    numel * max_abs * 2^(2 * frac_bits) / 2^63. A value >= 1 guarantees nothing."""
    _check_magnitude(max_abs, "max_abs")
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise SharingError(f"numel must be a non-negative int, got {numel!r}")
    _check_bits(frac_bits, "frac_bits", low=0)
    return numel * max_abs * 2.0 ** (2 * frac_bits) / 2.0 ** 63


def check_truncation_safe(max_abs: float, numel: int, *, max_failure: float = 1e-6) -> None:
    """The magnitude guard: ``SharingError`` stating the bound, max_abs and numel when
    ``truncation_failure_bound(max_abs, numel)`` exceeds ``max_failure``."""
    if not (isinstance(max_failure, numbers.Real) and 0.0 < max_failure <= 1.0):
        raise SharingError(f"max_failure must be in (0, 1], got {max_failure!r}")
    bound = truncation_failure_bound(max_abs, numel)
    if bound > max_failure:
        raise SharingError(f"truncation refused: failure bound {bound:.3g} > max_failure {max_failure:.3g} "
                           f"for max_abs={max_abs:.6g} and numel={numel}; scale the values down or "
                           f"truncate fewer elements at once")


def affine_share(
    s: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    party: int,
    max_abs: float,
    max_failure: float = 1e-6,
) -> torch.Tensor:
    """One party's share of ``x @ weight.T + bias`` (nn.Linear layout: weight [out, in]) from its
    share s ([..., in]) of x, at FRAC_BITS fractional bits.

    ``max_abs`` bounds every |x| entry (the data node checks it before sharing). Each output
    entry then satisfies |y_j| <= (max_abs + 2^-17) * ||encoded weight row j||_1, and the guard
    (``check_truncation_safe``) refuses before any work is done when that bound over all output
    elements exceeds ``max_failure``. The bias is added on party 0's share only.
    """
    _check_party(party)
    s = _ring_tensor(s, "s")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise SharingError(f"affine_share: weight must be a 2-D tensor [out, in], got {_describe(weight)}")
    if s.dim() < 1 or s.shape[-1] != weight.shape[1]:
        raise SharingError(f"affine_share: share of shape {tuple(s.shape)} does not match weight "
                           f"of shape {tuple(weight.shape)} (last dim must equal {weight.shape[1]})")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        raise SharingError(f"affine_share: bias must have shape ({weight.shape[0]},), got {_describe(bias)}")
    encoded_weight = encode(weight)
    encoded_bias = encode(bias) if bias is not None and party == 0 else None
    numel = math.prod(s.shape[:-1]) * weight.shape[0]
    check_truncation_safe(_affine_max_abs(encoded_weight, max_abs), numel, max_failure=max_failure)
    out = truncate(s @ encoded_weight.T, party=party)
    if encoded_bias is not None:
        out += encoded_bias
    return out


def _affine_max_abs(encoded_weight: torch.Tensor, max_abs: float) -> float:
    """Bound on |x @ W.T| entries, in real units, for |x| <= max_abs: an encoded x errs by at
    most 2^-17, so each entry is at most (max_abs + 2^-17) * (L1 norm of its encoded weight row)."""
    _check_magnitude(max_abs, "max_abs")
    if encoded_weight.numel() == 0:
        return 0.0
    row_l1 = float(encoded_weight.abs().to(torch.float64).sum(dim=1).max()) / SCALE
    return (max_abs + 2.0 ** -(FRAC_BITS + 1)) * row_l1


def sum_shares(shares: Sequence[torch.Tensor]) -> torch.Tensor:
    """The ring sum of several shares of the same shape: a server's share of the sum of the secrets."""
    if len(shares) == 0:
        raise SharingError("sum_shares: no shares to sum")
    tensors = [_ring_tensor(s, f"shares[{i}]") for i, s in enumerate(shares)]
    total = tensors[0].clone()
    for i, tensor in enumerate(tensors[1:], start=1):
        _check_same_shape(tensors[0], tensor, "shares[0]", f"shares[{i}]")
        total += tensor
    return total


def _ring_tensor(t: object, name: str) -> torch.Tensor:
    """t as a CPU int64 tensor, or ``SharingError`` naming ``name``."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
        raise SharingError(f"{name} must be an int64 ring tensor, got {_describe(t)}")
    return t.detach().cpu()


def _check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise SharingError(f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}")


def _check_party(party: int) -> None:
    if isinstance(party, bool) or party not in (0, 1):
        raise SharingError(f"party must be 0 or 1, got {party!r}")


def _check_bits(bits: int, name: str, *, low: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not low <= bits < 63:
        raise SharingError(f"{name} must be an int in [{low}, 62], got {bits!r}")


def _check_magnitude(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0):
        raise SharingError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_shape(shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    dims = tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise SharingError(f"shape must be non-negative ints, got {shape!r}")
    return dims


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return type(value).__name__

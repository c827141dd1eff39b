"""Additive secret sharing in Z_2^64: fixed point, masks, share-wise ops, truncation and its guard.

Ring results are checked against Python integers mod 2^64 and against the plaintext computation;
the statistical tests use fixed ChaCha20 keys, so they are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from gossamer.crypto.errors import CryptoError
from gossamer.crypto.sharing import (
    FRAC_BITS,
    MAX_ABS,
    SCALE,
    MaskStream,
    SharingError,
    add_public,
    affine_share,
    check_truncation_safe,
    decode,
    encode,
    matmul_public,
    reconstruct,
    reconstruct_float,
    share,
    share_float,
    sum_shares,
    truncate,
    truncation_failure_bound,
)

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))
ULP = 2.0 ** -FRAC_BITS
MOD = 1 << 64


def stream(key: bytes = KEY_A, counter: int = 0) -> MaskStream:
    return MaskStream(key=key, nonce=counter.to_bytes(4, "little") + bytes(12))


def to_signed(value: int) -> int:
    """A Python integer mod 2^64 as the signed int64 that represents it."""
    value %= MOD
    return value - MOD if value >= 1 << 63 else value


def unit_floats(ring: torch.Tensor) -> np.ndarray:
    """Ring words as floats in [0, 1): the top 53 bits of the unsigned word over 2^53."""
    return (ring.numpy().view(np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


# --- fixed point ---------------------------------------------------------------------------------


def test_max_abs_is_the_largest_encodable_magnitude() -> None:
    assert MAX_ABS == 2.0 ** (63 - FRAC_BITS) - 1 and SCALE == 2 ** FRAC_BITS
    assert encode(torch.tensor([MAX_ABS, -MAX_ABS], dtype=torch.float64)).tolist() == [
        2 ** 63 - SCALE, -(2 ** 63) + SCALE]


def test_encode_decode_round_trip_within_half_an_ulp_across_the_range() -> None:
    generator = torch.Generator().manual_seed(0)
    scales = 10.0 ** torch.arange(-6, 15, dtype=torch.float64)
    values = torch.randn(len(scales), 500, generator=generator, dtype=torch.float64) * scales[:, None]
    edges = torch.tensor([0.0, -0.0, ULP / 2, -ULP / 3, 1.0, -1.0, 12345.678, -12345.678,
                          MAX_ABS, -MAX_ABS, MAX_ABS - 0.3, -(MAX_ABS - 0.3), 2.0 ** 46 + 0.25], dtype=torch.float64)
    x = torch.cat([values.flatten().clamp(-MAX_ABS, MAX_ABS), edges])
    encoded = encode(x)
    assert encoded.dtype == torch.int64
    error = (decode(encoded) - x).abs()
    assert float(error.max()) <= ULP / 2
    assert decode(encode(torch.zeros(3))).tolist() == [0.0, 0.0, 0.0]


def test_encode_rounds_half_to_even() -> None:
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 0.49, 0.51], dtype=torch.float64) * ULP
    assert encode(x).tolist() == [0, 2, 2, 0, -2, 0, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_encode_of_narrow_floats_equals_the_float64_computation(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    limit = min(torch.finfo(dtype).max, MAX_ABS) / 4
    x = (torch.randn(200_000, generator=generator) * torch.logspace(-6, 6, 200_000)).clamp(-limit, limit).to(dtype)
    x[:7] = torch.tensor([0.5, 1.5, -2.5, 3.0, -0.0, 1e-7, -1e-7]).to(dtype)
    expected = torch.round(x.to(torch.float64) * SCALE).to(torch.int64)
    assert torch.equal(encode(x), expected)


def test_encode_keeps_the_shape_and_accepts_non_contiguous_and_empty_tensors() -> None:
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).transpose(0, 2)
    assert torch.equal(encode(x), (x.contiguous() * SCALE).to(torch.int64))
    assert encode(torch.zeros(0, 5)).shape == (0, 5)


@pytest.mark.parametrize(
    ("value", "match"),
    [(float("nan"), "non-finite"), (float("inf"), "non-finite"), (float("-inf"), "non-finite"),
     (MAX_ABS + 1, "MAX_ABS"), (-(MAX_ABS + 1), "MAX_ABS"), (1e30, "MAX_ABS")],
)
def test_encode_refuses_non_finite_and_out_of_range_values(value: float, match: str) -> None:
    x = torch.tensor([1.0, value, -2.0], dtype=torch.float64)
    with pytest.raises(SharingError, match=match):
        encode(x)


def test_encode_refuses_non_floating_input_and_sharing_error_is_a_crypto_error() -> None:
    with pytest.raises(SharingError, match="floating"):
        encode(torch.tensor([1, 2]))
    with pytest.raises(SharingError, match="floating"):
        encode([1.0, 2.0])  # type: ignore[arg-type]
    assert issubclass(SharingError, CryptoError)


def test_decode_reads_twos_complement_and_other_scales() -> None:
    r = torch.tensor([-1, -(2 ** 63), 2 ** 63 - 1, 3 << 32])
    assert decode(r).tolist() == [-ULP, -(2.0 ** 47), (2 ** 63 - 1) / SCALE, 3.0 * 2 ** 16]
    assert decode(r[3:], frac_bits=32).tolist() == [3.0]
    with pytest.raises(SharingError, match="int64"):
        decode(torch.zeros(2))
    with pytest.raises(SharingError, match="frac_bits"):
        decode(r, frac_bits=64)


# --- ring arithmetic -----------------------------------------------------------------------------


def test_int64_arithmetic_wraps_mod_2_64_like_python_integers() -> None:
    masks = stream()
    a, b = masks.ring((5, 4)), masks.ring((4, 3))
    c = masks.ring((5, 4))
    pa, pb, pc = a.tolist(), b.tolist(), c.tolist()
    expected_mm = [[to_signed(sum(pa[i][k] * pb[k][j] for k in range(4))) for j in range(3)] for i in range(5)]
    assert (a @ b).tolist() == expected_mm
    assert (a * c).tolist() == [[to_signed(x * y) for x, y in zip(ra, rc, strict=True)] for ra, rc in zip(pa, pc, strict=True)]
    assert (a + c).tolist() == [[to_signed(x + y) for x, y in zip(ra, rc, strict=True)] for ra, rc in zip(pa, pc, strict=True)]
    assert (-a).tolist() == [[to_signed(-x) for x in row] for row in pa]
    batched = masks.ring((2, 5, 4))
    assert (batched @ b).tolist() == [[[to_signed(sum(row[k] * pb[k][j] for k in range(4))) for j in range(3)]
                                       for row in plane] for plane in batched.tolist()]


def test_share_and_reconstruct_are_exact_for_ring_tensors() -> None:
    secret = stream(KEY_B).ring((64, 33))
    s0, s1 = share(secret, stream())
    assert torch.equal(reconstruct(s0, s1), secret)
    assert not torch.equal(s0, secret) and not torch.equal(s1, secret)


def test_share_float_reconstructs_the_encoding_exactly() -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, 50, 7, generator=generator) * 1000
    s0, s1 = share_float(x, stream())
    assert s0.shape == s1.shape == x.shape and s0.dtype == s1.dtype == torch.int64
    assert torch.equal(reconstruct(s0, s1), encode(x))
    assert torch.equal(reconstruct_float(s0, s1), decode(encode(x)))


def test_reconstruct_refuses_mismatched_or_non_ring_shares() -> None:
    with pytest.raises(SharingError, match="shape"):
        reconstruct(torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(SharingError, match="s1 must be an int64"):
        reconstruct(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int32))


# --- masks ---------------------------------------------------------------------------------------


def test_mask_stream_matches_the_rfc_8439_chacha20_block_vector() -> None:
    # RFC 8439 section 2.3.2: key 00..1f, block counter 1, nonce 00:00:00:09:00:00:00:4a:00:00:00:00.
    masks = MaskStream(key=bytes(range(32)), nonce=(1).to_bytes(4, "little") + bytes.fromhex("000000090000004a00000000"))
    assert masks.raw_bytes(64).hex() == (
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")


def test_mask_stream_is_reproducible_continues_across_calls_and_reads_little_endian_words() -> None:
    whole = stream().raw_bytes(8 * 30)
    split = stream()
    assert split.raw_bytes(24) + split.raw_bytes(0) + split.raw_bytes(8 * 30 - 24) == whole
    masks = stream()
    words = torch.cat([masks.ring((2, 3)).flatten(), masks.ring(torch.Size([24]))])
    assert words.tolist() == [to_signed(int.from_bytes(whole[i:i + 8], "little")) for i in range(0, 240, 8)]
    assert torch.equal(stream().ring((30,)), words)


def test_fresh_mask_streams_differ() -> None:
    assert not torch.equal(MaskStream().ring((8,)), MaskStream().ring((8,)))
    assert not torch.equal(stream(KEY_A).ring((8,)), stream(KEY_B).ring((8,)))


def test_mask_stream_neither_uses_nor_disturbs_torch_and_numpy_rngs() -> None:
    torch.manual_seed(0)
    first = stream().ring((16,))
    torch.manual_seed(1)
    np.random.seed(1)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    second = stream().ring((16,))
    assert torch.equal(first, second)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.random.get_state()[1].tolist() == numpy_state[1].tolist()


def test_mask_stream_refuses_bad_keys_and_an_exhausted_counter() -> None:
    with pytest.raises(SharingError, match="key must be 32 bytes"):
        MaskStream(key=bytes(16))
    with pytest.raises(SharingError, match="nonce must be 16 bytes"):
        MaskStream(key=KEY_A, nonce=bytes(12))
    with pytest.raises(SharingError, match="non-negative"):
        stream().raw_bytes(-1)
    with pytest.raises(SharingError, match="shape"):
        stream().ring((2, -1))
    last_block = stream(counter=2 ** 32 - 1)
    assert len(last_block.raw_bytes(64)) == 64
    with pytest.raises(SharingError, match="exhausted"):
        last_block.ring((1,))


def test_share_bits_are_balanced() -> None:
    secret = encode(torch.full((1_000_000,), 12345.678))
    s0, _ = share(secret, stream())
    bits = np.unpackbits(s0.numpy().view(np.uint8).reshape(-1, 8), axis=1)
    frequency = bits.mean(axis=0)
    sigma = 0.5 / np.sqrt(len(secret))
    assert np.all(np.abs(frequency - 0.5) <= 5 * sigma), frequency


def test_one_share_alone_does_not_depend_on_the_secret() -> None:
    n = 1_000_000
    share_of_zeros, _ = share_float(torch.zeros(n), stream(KEY_A))
    share_of_constant, _ = share_float(torch.full((n,), 12345.678), stream(KEY_B))
    zeros, constant = unit_floats(share_of_zeros), unit_floats(share_of_constant)
    assert stats.ks_2samp(zeros, constant).pvalue > 1e-3
    assert stats.kstest(constant, "uniform").pvalue > 1e-3
    # Same key, different secrets: the share moves by exactly the difference of the encodings.
    again, _ = share_float(torch.full((n,), 12345.678), stream(KEY_A))
    assert torch.equal(again - share_of_zeros, encode(torch.full((n,), 12345.678)))


# --- share-wise operations -----------------------------------------------------------------------


def test_add_public_counts_the_constant_once() -> None:
    x = torch.tensor([[1.5, -2.0, 3.25], [0.0, 7.0, -1.0]])
    constant = encode(torch.tensor([10.0, 20.0, 30.0]))
    s0, s1 = share_float(x, stream())
    t0, t1 = add_public(s0, constant, party=0), add_public(s1, constant, party=1)
    assert torch.equal(t1, s1) and t1 is not s1
    assert torch.equal(reconstruct(t0, t1), encode(x) + constant)
    with pytest.raises(SharingError, match="broadcast"):
        add_public(s0, encode(torch.zeros(3, 3)), party=0)


def test_matmul_public_is_linear_over_shares() -> None:
    generator = torch.Generator().manual_seed(3)
    x, public = torch.randn(6, 5, generator=generator), torch.randn(5, 4, generator=generator)
    s0, s1 = share_float(x, stream())
    product = reconstruct(matmul_public(s0, public), matmul_public(s1, public))
    assert torch.equal(product, encode(x) @ encode(public))
    with pytest.raises(SharingError, match="last dim"):
        matmul_public(s0, torch.randn(4, 4))
    with pytest.raises(SharingError, match="2-D"):
        matmul_public(s0, torch.randn(5))


def test_truncation_is_floor_or_one_more_at_moderate_magnitudes() -> None:
    n = 100_000
    magnitude = torch.randint(-(2 ** 40), 2 ** 40, (n,), generator=torch.Generator().manual_seed(4))
    s0, s1 = share(magnitude, stream())
    truncated = reconstruct(truncate(s0, party=0), truncate(s1, party=1))
    difference = truncated - (magnitude >> FRAC_BITS)  # arithmetic shift = floor division
    assert set(difference.unique().tolist()) <= {0, 1}
    assert int((difference == 1).sum()) > 0  # the +1 case does happen


def test_truncation_fails_at_large_magnitudes_at_the_predicted_rate() -> None:
    n = 100_000
    generator = torch.Generator().manual_seed(5)
    magnitude = torch.randint(2 ** 53, 2 ** 55, (n,), generator=generator)
    x = torch.where(torch.rand(n, generator=generator) < 0.5, magnitude, -magnitude)
    s0, s1 = share(x, stream())
    truncated = reconstruct(truncate(s0, party=0), truncate(s1, party=1))
    failures = int(((truncated - (x >> FRAC_BITS)).abs() > 1).sum())
    expected = float(magnitude.double().sum()) / 2.0 ** 64  # P(fail) = |x| / 2^64 per element
    assert expected / 3 <= failures <= expected * 3, (failures, expected)
    assert failures / n <= truncation_failure_bound(2.0 ** 55 / 2 ** 32, 1)


def test_truncation_failure_bound_and_guard() -> None:
    assert truncation_failure_bound(2.0 ** 16, 1000) == pytest.approx(1000 * 2.0 ** 48 / 2.0 ** 63)
    assert truncation_failure_bound(1.0, 8, frac_bits=8) == pytest.approx(8 * 2.0 ** 16 / 2.0 ** 63)
    check_truncation_safe(16.0, 100)  # bound 7.45e-7
    check_truncation_safe(16.0, 10_000, max_failure=1e-4)  # bound 7.45e-5
    with pytest.raises(SharingError, match=r"failure bound 1\.49e-06 > max_failure 1e-06.*max_abs=16 .*numel=200;"):
        check_truncation_safe(16.0, 200)
    with pytest.raises(SharingError, match="max_failure"):
        check_truncation_safe(1.0, 1, max_failure=0.0)
    with pytest.raises(SharingError, match="max_abs"):
        truncation_failure_bound(float("nan"), 1)
    with pytest.raises(SharingError, match="numel"):
        truncation_failure_bound(1.0, -1)


@pytest.mark.parametrize("party", [2, -1, True, "0"])
def test_share_wise_ops_refuse_a_party_other_than_0_or_1(party: object) -> None:
    s = torch.zeros(2, 3, dtype=torch.int64)
    for call in (lambda: truncate(s, party=party), lambda: add_public(s, s, party=party),
                 lambda: affine_share(s, torch.zeros(4, 3), None, party=party, max_abs=1.0)):
        with pytest.raises(SharingError, match="party must be 0 or 1"):
            call()


def affine_case(seed: int, batch: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.rand(*batch, 20, generator=generator) * 8 - 4).double()
    weight = torch.randn(10, 20, generator=generator, dtype=torch.float64) * 0.3
    bias = torch.randn(10, generator=generator, dtype=torch.float64)
    return x, weight, bias


@pytest.mark.parametrize("batch", [(32,), (2, 5)])
def test_affine_share_reconstructs_the_plaintext_affine_map(batch: tuple[int, ...]) -> None:
    x, weight, bias = affine_case(6, batch)
    s0, s1 = share_float(x, stream())
    y0 = affine_share(s0, weight, bias, party=0, max_abs=4.0, max_failure=1e-4)
    y1 = affine_share(s1, weight, bias, party=1, max_abs=4.0, max_failure=1e-4)
    error = (reconstruct_float(y0, y1) - (x @ weight.T + bias)).abs()
    # Encoding x and W errs by 2^-17 per entry, truncation by one ulp, the bias encoding by 2^-17.
    half = ULP / 2
    bound = half * (weight.abs().sum(1) + x.abs().sum(-1, keepdim=True) + weight.shape[1] * half) + ULP + half
    assert torch.all(error <= bound), float((error - bound).max())


def test_affine_share_adds_the_bias_on_party_0_only() -> None:
    x, weight, bias = affine_case(7, (16,))
    s0, s1 = share_float(x, stream())
    with_bias = [affine_share(s, weight, bias, party=p, max_abs=4.0, max_failure=1e-4) for p, s in enumerate((s0, s1))]
    without = [affine_share(s, weight, None, party=p, max_abs=4.0, max_failure=1e-4) for p, s in enumerate((s0, s1))]
    assert torch.equal(with_bias[1], without[1])
    assert torch.equal(with_bias[0] - without[0], encode(bias).expand(16, -1))


def test_affine_share_guard_bounds_outputs_by_max_abs_times_the_weight_row_l1_norm() -> None:
    x, weight, bias = affine_case(8, (4,))
    s0, _ = share_float(x, stream())
    row_l1 = float(decode(encode(weight)).abs().sum(1).max())
    bound = truncation_failure_bound((4.0 + ULP / 2) * row_l1, 4 * 10)
    assert bound < 1e-6  # the default accepts this small layer
    affine_share(s0, weight, bias, party=0, max_abs=4.0)
    affine_share(s0, weight, bias, party=0, max_abs=4.0, max_failure=bound * 1.001)
    with pytest.raises(SharingError, match="failure bound"):
        affine_share(s0, weight, bias, party=0, max_abs=4.0, max_failure=bound * 0.999)


def test_affine_share_guard_and_input_checks_refuse_before_computing() -> None:
    x, weight, bias = affine_case(8, (4,))
    s0, _ = share_float(x, stream())
    with pytest.raises(SharingError, match="failure bound"):
        affine_share(s0, weight, bias, party=0, max_abs=2.0 ** 24)
    with pytest.raises(SharingError, match="failure bound"):
        affine_share(s0, weight, bias, party=0, max_abs=4.0, max_failure=1e-15)
    with pytest.raises(SharingError, match="last dim"):
        affine_share(s0, weight.T, None, party=0, max_abs=4.0)
    with pytest.raises(SharingError, match="bias"):
        affine_share(s0, weight, bias[:3], party=0, max_abs=4.0)
    with pytest.raises(SharingError, match="int64"):
        affine_share(x, weight, bias, party=0, max_abs=4.0)
    with pytest.raises(SharingError, match="max_abs"):
        affine_share(s0, weight, bias, party=0, max_abs=-1.0)


def test_sum_shares_aggregates_secrets_without_reconstructing_any_one() -> None:
    generator = torch.Generator().manual_seed(9)
    secrets = [torch.randn(4, 6, generator=generator) for _ in range(3)]
    masks = stream()
    pairs = [share_float(secret, masks) for secret in secrets]
    server0 = sum_shares([s0 for s0, _ in pairs])
    server1 = sum_shares([s1 for _, s1 in pairs])
    assert torch.equal(reconstruct(server0, server1), sum_shares([encode(s) for s in secrets]))
    plain = [[to_signed(sum(col)) for col in zip(*rows, strict=True)]
             for rows in zip(*(s0.tolist() for s0, _ in pairs), strict=True)]
    assert server0.tolist() == plain
    with pytest.raises(SharingError, match="no shares"):
        sum_shares([])
    with pytest.raises(SharingError, match=r"shares\[1\] has shape"):
        sum_shares([server0, server0[:2]])

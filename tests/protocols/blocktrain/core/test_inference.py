"""BlockTrain inference: one pass is noise, every block's Euler step and readout; generation
commits one more byte per pass."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.blocktrain.core import (
    BlockTrainError,
    band_edges,
    build_stack,
    denoise,
    denoise_pass,
    denoise_step,
    generate,
    initial_noise,
    readout,
    target_embedding,
)
from tests.protocols.blocktrain.core.support import TINY, gen, tokens


def test_denoise_pass_equals_noise_then_every_block_step_then_readout_bit_for_bit() -> None:
    stack = build_stack(TINY, seed=3, device="cpu")
    context = tokens(4, batch=3)

    logits = denoise_pass(stack, context, generator=gen(5))

    z = initial_noise(TINY, (3, 8), generator=gen(5), device="cpu")
    for k in (2, 1, 0):
        z = denoise_step(stack, k, context, z)
    assert logits.shape == (3, 8, 256)
    assert torch.equal(logits, readout(stack, z))


def test_denoise_step_is_one_euler_step_and_block_zero_lands_on_its_estimate() -> None:
    stack = build_stack(TINY, seed=3, device="cpu")
    context = tokens(4)
    edges = band_edges(TINY)
    z = initial_noise(TINY, (2, 8), generator=gen(6), device="cpu") * edges[2] / TINY.sigma_max
    embedding = target_embedding(stack)

    with torch.no_grad():
        d1 = denoise(stack, 1, context, z, torch.full((2,), edges[2]))
        expected = torch.softmax(d1 @ embedding.T, dim=-1) @ embedding
        euler = z + (edges[1] - edges[2]) * (z - expected) / edges[2]
        d0 = denoise(stack, 0, context, z, torch.full((2,), edges[1]))

    assert torch.allclose(denoise_step(stack, 1, context, z), euler, atol=1e-6)
    assert torch.equal(denoise_step(stack, 0, context, z), d0)
    assert torch.allclose(readout(stack, d0), d0 @ embedding.T, atol=1e-6)


@pytest.mark.parametrize(
    ("z_shape", "field"), [((2, 8, 15), "z"), ((2, 7, 16), "z"), ((8, 16), "z")]
)
def test_denoise_step_refuses_a_z_of_the_wrong_shape(z_shape: tuple[int, ...], field: str) -> None:
    stack = build_stack(TINY, seed=0, device="cpu")

    with pytest.raises(BlockTrainError, match=field):
        denoise_step(stack, 0, tokens(0), torch.zeros(z_shape))
    with pytest.raises(BlockTrainError, match="block"):
        denoise_step(stack, -1, tokens(0), torch.zeros(2, 8, 16))


def test_generate_commits_one_more_byte_per_pass() -> None:
    stack = build_stack(TINY, seed=0, device="cpu")
    prompt = b"def f(x):"

    runs = {t: generate(stack, prompt, new_bytes=4, passes=t, generator=gen(9)) for t in (1, 2, 3, 4, 9)}

    assert all(len(out) == 4 for out in runs.values())
    # pass i is identical for every run that makes it, so the first i committed bytes agree
    for t in (1, 2, 3):
        assert runs[t][:t] == runs[t + 1][:t]
    assert runs[4] == runs[9]  # passes beyond the segment length change nothing
    assert generate(stack, prompt, new_bytes=4, passes=2, generator=gen(9)) == runs[2]
    long = generate(stack, prompt, new_bytes=11, passes=1, generator=gen(9), temperature=0)
    assert len(long) == 11  # several segments of context // 2 bytes


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt": b""}, "prompt"),
        ({"new_bytes": -1}, "new_bytes"),
        ({"passes": 0}, "passes"),
        ({"temperature": -0.5}, "temperature"),
    ],
)
def test_generate_refuses_bad_arguments(kwargs: dict, field: str) -> None:
    stack = build_stack(TINY, seed=0, device="cpu")
    arguments = {"prompt": b"ab", "new_bytes": 2, "passes": 1, **kwargs}

    with pytest.raises(BlockTrainError, match=field):
        generate(stack, generator=gen(0), **arguments)

"""Inference: one pass through the block stack (each block one Euler step of the probability-flow
ODE on every position, from sigma_max down to the logits), and open-ended generation in segments
of up to context // 2 bytes, one more byte committed per pass. The segment loop is sans-I/O
(``generation_steps``), driven in one process (``generate``) or through block servers
(``protocols/blocktrain/client.py``). The method: ``protocols/blocktrain/README.md``."""

from __future__ import annotations

from collections.abc import Generator

import torch
import torch.nn.functional as F

from gossamer.protocols.blocktrain.core.bands import band_edges
from gossamer.protocols.blocktrain.core.config import BlockTrainConfig
from gossamer.protocols.blocktrain.core.errors import BlockTrainError, check_block, check_positive_int
from gossamer.protocols.blocktrain.core.model import BlockStack, check_tokens, denoise, target_embedding

PLACEHOLDER_BYTE = 0x20
"""What ``generate`` puts in the not-yet-known context positions before the first pass."""


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
    check_block(stack.config, k)
    check_tokens(stack, "context", context)
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
def denoise_pass(stack: BlockStack, context: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
    """One pass in one process: initial noise, blocks B-1 .. 0, readout -> logits [batch, T, vocab]."""
    check_tokens(stack, "context", context)
    z = initial_noise(stack.config, tuple(context.shape), generator=generator, device=context.device)
    for k in reversed(range(stack.config.num_blocks)):
        z = denoise_step(stack, k, context, z)
    return readout(stack, z)


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
    """One pass's update of a generation segment, in place (shared with remote generation).

    ``window`` [1, start + count] holds the committed prefix and the segment's ``count`` bytes;
    ``logits`` [count, vocab] are the pass's logits for them. Byte ``committed`` is drawn
    alone (it saw a fully committed prefix); the later bytes become the argmax drafts, or, in the
    ``last`` pass, are drawn too.
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
    passes: int,
    generator: torch.Generator,
    temperature: float = 1.0,
    device: torch.device | str = "cpu",
) -> Generator[torch.Tensor, torch.Tensor, bytes]:
    """Generation without the passes (sans-I/O): yields each context window [1, T] to run a pass on,
    takes that pass's logits [1, T, vocab] back through ``send``, and returns the new bytes.

    Whoever runs the passes drives it: ``generate`` in one process, ``BlockTrainClient`` (the
    roles' ``client`` module) through block servers, so the segment loop exists once and both draw from
    ``generator`` in the same order (a pass draws its initial noise, then ``update_segment``).
    ``temperature == 0`` is greedy. BlockTrainError for a bad request, at the first ``next``.
    """
    if config.vocab != 256:
        raise BlockTrainError(f"vocab: generate needs a byte vocabulary (256), got {config.vocab}")
    if not isinstance(prompt, bytes | bytearray) or not prompt:
        raise BlockTrainError("prompt: must be at least one byte")
    if not isinstance(new_bytes, int) or isinstance(new_bytes, bool) or new_bytes < 0:
        raise BlockTrainError(f"new_bytes: must be a non-negative integer, got {new_bytes!r}")
    check_positive_int("passes", passes)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not temperature >= 0:
        raise BlockTrainError(f"temperature: must be a number >= 0, got {temperature!r}")
    sequence = bytearray(prompt)
    span = max(1, config.context // 2)
    while len(sequence) < len(prompt) + new_bytes:
        count = min(span, len(prompt) + new_bytes - len(sequence))
        prefix = list(sequence[-(config.context - count + 1) :])
        window = torch.tensor([prefix + [PLACEHOLDER_BYTE] * count], dtype=torch.long, device=device)
        rounds = min(passes, count)
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
    passes: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> bytes:
    """Continue ``prompt`` by ``new_bytes`` bytes, ``passes`` passes per segment, in one
    process (``generation_steps`` driven by ``denoise_pass``)."""
    steps = generation_steps(stack.config, prompt, new_bytes=new_bytes, passes=passes, generator=generator,
                             temperature=temperature, device=stack.embed.weight.device)
    try:
        window = next(steps)
        while True:
            window = steps.send(denoise_pass(stack, window, generator=generator))
    except StopIteration as done:
        return done.value

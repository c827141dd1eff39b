"""BlockTrain's stack: block and embedding states move exactly what they name, bad states are refused
untouched, a seed fixes the stack."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.blocktrain.core import (
    BlockTrainError,
    build_stack,
)
from tests.protocols.blocktrain.core.support import TINY


def test_block_state_round_trip_moves_exactly_one_block() -> None:
    source, target = build_stack(TINY, seed=1, device="cpu"), build_stack(TINY, seed=2, device="cpu")
    others = {k: target.block_state(k) for k in (0, 2)}

    state = source.block_state(1)
    target.load_block_state(1, state)

    assert state.keys() == dict(target.blocks[1].named_parameters()).keys()
    assert all(torch.equal(target.block_state(1)[name], value) for name, value in state.items())
    for k, kept in others.items():
        assert all(torch.equal(target.block_state(k)[name], value) for name, value in kept.items())
    next(iter(state.values())).add_(1.0)  # a detached copy: editing it leaves the stack alone
    assert not torch.equal(next(iter(state.values())), next(iter(target.block_state(1).values())))


def _bad_states(good: dict[str, torch.Tensor]) -> list[tuple[dict, str]]:
    names = sorted(good)
    missing = {n: v for n, v in good.items() if n != names[-1]}
    extra = {**good, "rogue.weight": torch.zeros(1)}
    shaped = {**good, names[-1]: torch.zeros(3, 3)}
    nan = {**good, names[-1]: torch.full_like(good[names[-1]], float("nan"))}
    integer = {**good, names[-1]: good[names[-1]].long()}
    return [(missing, "missing"), (extra, "rogue"), (shaped, "shape"), (nan, "NaN"), (integer, "floating")]


def test_load_block_state_refuses_bad_states_without_touching_anything() -> None:
    stack = build_stack(TINY, seed=1, device="cpu")
    good = build_stack(TINY, seed=2, device="cpu").block_state(0)
    before = stack.block_state(0)

    for bad, field in _bad_states(good):
        with pytest.raises(BlockTrainError, match=field):
            stack.load_block_state(0, bad)
        assert all(torch.equal(stack.block_state(0)[n], v) for n, v in before.items())
    with pytest.raises(BlockTrainError, match="block"):
        stack.load_block_state(3, good)


def test_embedding_state_round_trip_and_refusals() -> None:
    source, target = build_stack(TINY, seed=1, device="cpu"), build_stack(TINY, seed=2, device="cpu")

    target.load_embedding_state(source.embedding_state())

    assert torch.equal(target.embed.weight, source.embed.weight)
    assert source.embed.weight.norm(dim=1).tolist() == pytest.approx([TINY.sigma_data] * 256, rel=1e-5)
    with pytest.raises(BlockTrainError, match="shape"):
        target.load_embedding_state({"weight": torch.zeros(256, 8)})
    with pytest.raises(BlockTrainError, match="missing"):
        target.load_embedding_state({})


def test_same_seed_builds_the_same_stack() -> None:
    a, b = build_stack(TINY, seed=7, device="cpu"), build_stack(TINY, seed=7, device="cpu")

    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not a.embed.weight.requires_grad
    with pytest.raises(BlockTrainError, match="seed"):
        build_stack(TINY, seed=-1, device="cpu")

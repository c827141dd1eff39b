"""Ring attention equals single-device attention of the same reparameterised model, output and gradients."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from gossamer.protocols.context.core import (
    InvalidRing,
    Outgoing,
    RingMember,
    SubspaceConfig,
    clip_shares,
    forward_to,
    reduce_gradients,
    run_ring,
    split_chunks,
)
from gossamer.protocols.context.core.blockwise import block_backward, block_forward, merge, output_delta
from gossamer.protocols.core.models import ModelConfig
from tests.protocols.context.core.conftest import CODINGS, batch, tiny_model


def members_for(model, tokens, targets, chunks, *, step=0):
    pieces = split_chunks(tokens, targets, chunks)
    return [RingMember(model, index=i, chunks=chunks, step=step, tokens=x, targets=y) for i, (x, y) in enumerate(pieces)]


def reference(model, tokens, targets):
    model.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("chunks", [1, 2, 4])
@pytest.mark.parametrize("subspace", CODINGS, ids=lambda s: s.label())
def test_ring_loss_and_every_gradient_equal_the_single_device_model(subspace: SubspaceConfig, chunks: int) -> None:
    model = tiny_model(subspace)
    tokens, targets = batch()
    want_loss, want_grads = reference(model, tokens, targets)

    members = members_for(model, tokens, targets, chunks)
    run_ring(members)
    loss = sum(m.loss for m in members)
    grads = reduce_gradients([m.gradients() for m in members])

    assert torch.allclose(loss, want_loss, atol=1e-12, rtol=0)
    assert grads.keys() == want_grads.keys()
    for name, want in want_grads.items():
        assert torch.allclose(grads[name], want, atol=1e-10, rtol=0), name
    assert all(p.grad is None for p in model.parameters()), "members keep their gradients to themselves"


def test_blockwise_attention_over_chunks_equals_causal_attention() -> None:
    generator = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, 3, 24, 8, generator=generator, dtype=torch.float64) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want.backward(dout)

    chunks = 3
    qs, ks, vs, dos = (t.detach().chunk(chunks, dim=2) for t in (q, k, v, dout))
    for p in range(chunks):
        acc = None
        for j in [p, *reversed(range(p))]:
            acc = merge(acc, block_forward(qs[p], ks[j], vs[j], causal=j == p))
        out, lse = acc
        assert torch.allclose(out, want[:, :, p * 8:(p + 1) * 8], atol=1e-12)
        delta = output_delta(out, dos[p])
        dq = sum(block_backward(qs[p], ks[j], vs[j], dos[p], lse, delta, causal=j == p)[0] for j in range(p + 1))
        assert torch.allclose(dq, q.grad[:, :, p * 8:(p + 1) * 8], atol=1e-12)
    for j in range(chunks):
        dk = sum(block_backward(qs[p], ks[j], vs[j], dos[p], *_lse_delta(qs, ks, vs, dos, p), causal=j == p)[1]
                 for p in range(j, chunks))
        assert torch.allclose(dk, k.grad[:, :, j * 8:(j + 1) * 8], atol=1e-12)


def _lse_delta(qs, ks, vs, dos, p):
    acc = None
    for j in range(p + 1):
        acc = merge(acc, block_forward(qs[p], ks[j], vs[j], causal=j == p))
    return acc[1], output_delta(acc[0], dos[p])


def test_arrival_order_does_not_change_a_single_bit() -> None:
    model = tiny_model(SubspaceConfig(rank=2, mixtures=2))
    tokens, targets = batch()
    first = members_for(model, tokens, targets, 4)
    run_ring(first)

    second = members_for(model, tokens, targets, 4)
    rng = random.Random(0)
    pending = []
    while not all(m.done for m in second):
        for member in second:
            pending += [(member.index, send) for send in member.step() or []]
        rng.shuffle(pending)
        while pending:
            _, send = pending.pop()
            second[send.to].deliver(send.message)
            onward = forward_to(send.to, 4) if send.message.kind == "kv" else None
            pending += [] if onward is None else [(send.to, Outgoing(onward, send.message))]
            rng.shuffle(pending)

    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.loss, b.loss)
        assert all(torch.equal(a.gradients()[n], g) for n, g in b.gradients().items())


def test_ring_set_up_errors_name_the_field() -> None:
    model = tiny_model(SubspaceConfig(rank=2))
    tokens, targets = batch()
    with pytest.raises(InvalidRing, match="index"):
        RingMember(model, index=4, chunks=4, step=0, tokens=tokens[:, :8], targets=targets[:, :8])
    with pytest.raises(InvalidRing, match="context"):
        RingMember(model, index=0, chunks=8, step=0, tokens=tokens[:, :8], targets=targets[:, :8])
    with pytest.raises(InvalidRing, match="chunks"):
        split_chunks(tokens, targets, 5)
    dropout = tiny_model(SubspaceConfig(rank=2), config=ModelConfig(d_model=32, n_layers=1, n_heads=4, context=32,
                                                                      dropout=0.1))
    with pytest.raises(InvalidRing, match="dropout"):
        RingMember(dropout, index=0, chunks=4, step=0, tokens=tokens[:, :8], targets=targets[:, :8])
    member = RingMember(model, index=0, chunks=4, step=0, tokens=tokens[:, :8], targets=targets[:, :8])
    with pytest.raises(InvalidRing, match="not finished"):
        member.gradients()


def test_a_ring_missing_a_member_says_who_waits_for_what() -> None:
    model = tiny_model(SubspaceConfig(rank=2))
    tokens, targets = batch()
    members = members_for(model, tokens, targets, 2)
    with pytest.raises(InvalidRing, match="members"):
        run_ring(members[1:])
    lone = members[1]
    while lone.step() is not None:
        pass
    assert lone.waiting_for == ("kv", 0, 0, None)


def test_clip_shares_scales_only_the_shares_above_factor_times_the_lower_median_norm() -> None:
    shares = [{"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.0, 1.0])}, {"w": torch.tensor([-60.0, 80.0])}]

    clipped, scaled = clip_shares(shares, 1.0)

    assert scaled == {2: 100.0}  # the lower median of 5, 1 and 100 is 5
    assert clipped[0] is shares[0] and clipped[1] is shares[1]  # untouched: the sum stays bitwise exact
    torch.testing.assert_close(clipped[2]["w"], torch.tensor([-3.0, 4.0]))
    assert clip_shares(shares, 0.0) == (shares, {}) and clip_shares(shares[:1], 1.0) == (shares[:1], {})
    assert clip_shares(shares, 20.0)[1] == {}
    _, two = clip_shares(shares[1:], 1.0)  # two members: the smaller norm is the bound
    assert two == {1: 100.0}

"""Subspace coding: seeded init, orthonormal bases after every update, basis hashes, the step's plan."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.context.core import (
    InvalidRing,
    RingMember,
    SubspaceAttention,
    SubspaceConfig,
    apply_update,
    basis_hash,
    build_context_model,
    message_plan,
    orthonormality_error,
    project_basis_grads,
    reduce_gradients,
    run_ring,
    split_chunks,
    subspace_of,
)
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig, build_model
from tests.protocols.context.core.conftest import TINY, batch, tiny_model


def test_dense_is_exactly_build_model_and_the_names_follow_byte_transformer() -> None:
    dense = build_context_model(TINY, SubspaceConfig(), seed=5)
    plain = build_model(TINY, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(dense.state_dict().values(), plain.state_dict().values(), strict=True))

    coded = build_context_model(TINY, SubspaceConfig(rank=2, mixtures=3), seed=5)
    names = {n.removeprefix("blocks.0.") for n, _ in coded.named_parameters() if n.startswith("blocks.0.attn.")}
    assert names == {"attn.q.weight", "attn.q.bias", "attn.k_coef.weight", "attn.k_coef.bias", "attn.v_coef.weight",
                     "attn.v_coef.bias", "attn.gate.weight", "attn.gate.bias", "attn.k_basis", "attn.v_basis",
                     "attn.proj.weight", "attn.proj.bias"}
    assert subspace_of(coded) == SubspaceConfig(rank=2, mixtures=3)
    assert tuple(coded.blocks[1].attn.k_basis.shape) == (4, 3, 8, 2)


def test_init_is_seeded_leaves_the_global_rng_alone_and_is_orthonormal() -> None:
    state = torch.random.get_rng_state()
    a = build_context_model(TINY, SubspaceConfig(rank=2, mixtures=2), seed=3)
    b = build_context_model(TINY, SubspaceConfig(rank=2, mixtures=2), seed=3)
    c = build_context_model(TINY, SubspaceConfig(rank=2, mixtures=2), seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.blocks[0].attn.k_basis, c.blocks[0].attn.k_basis)
    assert orthonormality_error(a) < 1e-6
    assert basis_hash(a.blocks[0].attn, 0) == basis_hash(b.blocks[0].attn, 0) != basis_hash(c.blocks[0].attn, 0)
    assert basis_hash(a.blocks[0].attn, 0) != basis_hash(a.blocks[1].attn, 1)


def test_bases_stay_orthonormal_after_every_update_and_identical_replicas_agree() -> None:
    tokens, targets = batch(size=2, length=32)
    replicas = [tiny_model(SubspaceConfig(rank=2, mixtures=2)) for _ in range(2)]
    optimizers = [torch.optim.AdamW(r.parameters(), lr=3e-2, weight_decay=0.0) for r in replicas]
    hashes = []
    for step in range(5):
        members = [RingMember(replicas[0], index=i, chunks=4, step=step, tokens=x, targets=y)
                   for i, (x, y) in enumerate(split_chunks(tokens, targets, 4))]
        run_ring(members)
        grads = reduce_gradients([m.gradients() for m in members])
        for replica, optimizer in zip(replicas, optimizers, strict=True):
            apply_update(replica, optimizer, grads)
            assert orthonormality_error(replica) < 1e-12
        hashes.append(basis_hash(replicas[0].blocks[0].attn, 0))
        assert hashes[-1] == basis_hash(replicas[1].blocks[0].attn, 0)
    assert len(set(hashes)) == 5, "the bases move, and the hash with them"


def test_projected_basis_gradients_are_tangent() -> None:
    model = tiny_model(SubspaceConfig(rank=3, mixtures=2))
    generator = torch.Generator().manual_seed(0)
    for block in model.blocks:
        for basis in (block.attn.k_basis, block.attn.v_basis):
            basis.grad = torch.randn(basis.shape, generator=generator, dtype=basis.dtype)
    project_basis_grads(model)
    for block in model.blocks:
        basis = block.attn.k_basis
        skew = basis.transpose(-1, -2) @ basis.grad
        assert torch.allclose(skew, -skew.transpose(-1, -2), atol=1e-12)


def test_coding_set_up_errors_name_the_field() -> None:
    with pytest.raises(InvalidSetting, match="rank must be >= 1"):
        SubspaceConfig(rank=0)
    with pytest.raises(InvalidSetting, match="mixtures must be >= 1"):
        SubspaceConfig(rank=2, mixtures=0)
    with pytest.raises(InvalidSetting, match="mixtures must be <= 256"):
        SubspaceConfig(rank=2, mixtures=257)
    with pytest.raises(InvalidSetting, match="mixtures must be 1 without a rank"):
        SubspaceConfig(mixtures=2)
    with pytest.raises(InvalidRing, match="rank"):
        build_context_model(TINY, SubspaceConfig(rank=9), seed=0)
    with pytest.raises(InvalidSetting, match="unknown keys"):
        SubspaceConfig.from_dict({"rank": 2, "rnak": 3})
    assert SubspaceConfig.from_dict({"rank": 2, "mixtures": 4}).label() == "r2-m4"
    assert isinstance(build_context_model(TINY, SubspaceConfig(rank=8), seed=0).blocks[0].attn, SubspaceAttention)


@pytest.mark.parametrize(("chunks", "layers"), [(4, 2), (3, 1), (1, 2)])
def test_the_plan_is_what_the_members_send_in_an_order_they_could(chunks: int, layers: int) -> None:
    config = ModelConfig(d_model=32, n_layers=layers, n_heads=4, context=12 * chunks)
    model = tiny_model(SubspaceConfig(rank=2), config=config)
    tokens, targets = batch(length=12 * chunks)
    members = [RingMember(model, index=i, chunks=chunks, step=0, tokens=x, targets=y)
               for i, (x, y) in enumerate(split_chunks(tokens, targets, chunks))]
    trace = run_ring(members)

    plan = message_plan(chunks, layers)
    sent = [(s.source, s.target, s.message.key) for s in trace.sent]
    assert sorted(sent, key=repr) == sorted(((p.source, p.target, p.key) for p in plan), key=repr)
    delivered: set = set()
    position = {(s, t, k): i for i, (s, t, k) in enumerate(sent)}
    for planned in sorted(plan, key=lambda p: position[(p.source, p.target, p.key)]):
        assert set(planned.after) <= delivered, planned
        delivered.add((planned.target, *planned.key))

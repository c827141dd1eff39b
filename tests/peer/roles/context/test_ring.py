"""cp-shards on a LocalNet (real TCP frames, signatures, one view of signed records) train exactly
what one process computes: the same ring steps, the same summed gradient, the same update, on
every shard; every ledger balances."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.peer.roles.context.replica import RingData, build_optimizer
from gossamer.protocols.context import (
    RingMember,
    apply_update,
    build_context_model,
    reduce_gradients,
    run_ring,
)
from tests.peer.roles.context.harness import RUN, drain, shards

pytestmark = pytest.mark.timeout(180)


def reference(roles, steps: int) -> torch.nn.Module:
    """The same steps in one process: ``run_ring`` over every member, summed, one update."""
    settings = roles[0].settings
    data = RingData.load(settings.data_source, heldout_fraction=settings.heldout_fraction)
    model = build_context_model(settings.model, settings.subspace, seed=settings.seed)
    optimizer = build_optimizer(model, settings)
    chunks = len(roles)
    for step in range(steps):
        members = []
        for index in range(chunks):
            tokens, targets = data.chunk(step=step, seed=settings.seed, batch_size=settings.batch_size, chunks=chunks,
                                         chunk_tokens=settings.chunk_tokens, index=index)
            members.append(RingMember(model, index=index, chunks=chunks, step=step, tokens=tokens, targets=targets))
        run_ring(members)
        grads = reduce_gradients([{n: g.cpu() for n, g in m.gradients().items()} for m in members])
        apply_update(model, optimizer, grads, grad_clip=settings.grad_clip)
    return model


async def test_three_shards_train_what_one_process_computes(tmp_path: Path) -> None:
    net, roles = await shards(tmp_path, RUN, 3)
    try:
        await net.start()
        await drain(roles)

        steps = RUN["hyper"]["steps"]
        expected = reference(roles, steps)
        for role in roles:
            assert role.finished and role.replica.version == steps
            applied = [ledger for ledger in role.history if ledger.applied]
            assert [ledger.step for ledger in applied] == list(range(steps))
            for ledger in role.history:
                assert ledger.coefficients.balance_problems() == [] and ledger.reduce.balance_problems() == []
            for name, param in role.replica.model.named_parameters():
                assert torch.equal(param, dict(expected.named_parameters())[name]), name
    finally:
        await net.aclose()

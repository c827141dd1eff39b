"""cp-shards on a LocalNet (real TCP frames, signatures, one view of signed records) train exactly
what one process computes: the same ring steps, the same summed gradient, the same update, on
every shard; every ledger balances."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.peer.roles.context.harness import RUN, drain, reference, shards

pytestmark = pytest.mark.timeout(180)


async def test_three_shards_train_what_one_process_computes(tmp_path: Path) -> None:
    net, roles = await shards(tmp_path, RUN, 3)
    try:
        await net.start()
        await drain(roles)

        steps = RUN["hyper"]["steps"]
        expected = reference(roles[0].settings, chunks=len(roles), steps=steps)
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

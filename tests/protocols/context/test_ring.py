"""cp-shards on a LocalNet (real TCP frames, signatures, one view of signed records) train exactly
what one process computes: the same ring steps, the same summed gradient, the same update, on
every shard; every ledger balances. A shard that holds another model at the ring's step (a ring
that trained apart) takes the leader's state before it trains with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.protocols.context.harness import RUN, drain, reference, shards

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
            applied = [ledger for ledger in role.runner.history if ledger.applied]
            assert [ledger.step for ledger in applied] == list(range(steps))
            for ledger in role.runner.history:
                assert ledger.coefficients.balance_problems() == [] and ledger.reduce.balance_problems() == []
            for name, param in role.replica.model.named_parameters():
                assert torch.equal(param, dict(expected.named_parameters())[name]), name
    finally:
        await net.aclose()


async def test_a_shard_with_another_model_at_the_same_step_takes_the_leaders_before_it_trains(
        tmp_path: Path) -> None:
    net, roles = await shards(tmp_path, RUN, 3)
    try:
        # s2 holds another model at version 0: what a shard brings from a ring of its own that
        # trained apart from this one while their views had not met (same step, other weights).
        version, state = roles[2].replica.model_state()
        roles[2].replica.adopt(version, {name: t + 0.01 if t.is_floating_point() else t for name, t in state.items()})
        adopted: list[tuple[str, dict]] = []
        downloading: list[tuple[str, int, int]] = []  # (peer, shards verified, shards) as it went
        net.watchers.append(lambda peer, event, fields: adopted.append((peer, dict(fields))) if event == "context.adopted" else None)
        net.watchers.append(lambda peer, event, fields: downloading.append((peer, fields["shards_done"], fields["shards"]))
                            if event == "context.downloading" else None)
        await net.start()
        await drain(roles)

        expected = reference(roles[0].settings, chunks=len(roles), steps=RUN["hyper"]["steps"])
        for role in roles:
            for name, param in role.replica.model.named_parameters():
                assert torch.equal(param, dict(expected.named_parameters())[name]), (role.peer_id[:8], name)
        assert [(peer, fields["step"], fields["why"]) for peer, fields in adopted] == [("s2", 0, "placed in the ring")]
        assert downloading == [("s2", 0, 1), ("s2", 1, 1)]  # from the leader alone: one shard, said before and after
    finally:
        await net.aclose()

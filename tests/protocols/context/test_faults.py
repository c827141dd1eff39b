"""A cp-shard that dies (its servers and tasks gone) aborts the step it was in within the deadline,
or fails the next plan; a dead leader's followers wait for its record to expire and the next
lowest peer leads. The survivors re-form the ring without it,
with a shorter context, and train on in step; a shard that joins mid-run downloads the state and
is placed in the ring at the next step boundary. Every ledger balances."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.protocols.context.shard import CpShardRole
from tests.protocols.context.harness import drain, identities, run_config, shards

pytestmark = pytest.mark.timeout(240)


def same_parameters(roles: list[CpShardRole]) -> bool:
    first = dict(roles[0].replica.model.named_parameters())
    return all(torch.equal(first[name], param) for role in roles[1:]
               for name, param in role.replica.model.named_parameters())


def blamed(role: CpShardRole, peer_id: str) -> bool:
    """Whether one of ``role``'s ledgers suspects ``peer_id`` or failed to send it its update."""
    return any(peer_id in ledger.suspects or peer_id in ledger.reduce.send_failures for ledger in role.runner.history)


def check_ledgers(role: CpShardRole) -> None:
    for ledger in role.runner.history:
        assert ledger.coefficients.balance_problems() == [], ledger.to_json()
        assert ledger.reduce.balance_problems() == [], ledger.to_json()
        assert ledger.applied != bool(ledger.aborted), ledger.to_json()


@pytest.mark.parametrize("victim", [2, 0], ids=["member", "leader"])
async def test_a_dead_shard_aborts_the_step_and_the_survivors_go_on_shorter(tmp_path: Path, victim: int) -> None:
    run = run_config(steps=7, plan_timeout_s=5.0, step_timeout_s=10.0)
    net, roles = await shards(tmp_path, run, 4)
    try:
        await net.start()
        assert await roles[1].until_step(2, timeout_s=120)
        dead = roles[victim]
        await net.kill(f"s{victim}")
        if victim == 0:  # the others wait for its plans until its record expires (a DHT read after the TTL)
            net.forget("s0")
            await net.publish()
        survivors = [role for role in roles if role is not dead]
        await drain(survivors)

        assert all(role.finished and role.replica.version == 7 for role in survivors)
        if victim != 0:  # the leader found it dead (an aborted step, or a plan or update it could not send)
            assert blamed(roles[0], dead.peer_id)
        for role in survivors:
            check_ledgers(role)
            applied = [ledger for ledger in role.runner.history if ledger.applied]
            assert [ledger.step for ledger in applied] == list(range(7))
            assert applied[0].chunks == 4 and applied[0].context == 32
            assert applied[-1].chunks == 3 and applied[-1].context == 24
            assert dead.peer_id not in applied[-1].members and applied[-1].leader == survivors[0].peer_id
        assert same_parameters(survivors)
    finally:
        await net.aclose()


async def test_a_joiner_downloads_the_state_and_is_placed_at_the_next_step(tmp_path: Path) -> None:
    run = run_config(steps=6)
    net, roles = await shards(tmp_path, run, 2)
    try:
        await net.start()
        assert await roles[0].until_step(2, timeout_s=120)
        joiner_identity = max(identities(3), key=lambda identity: identity.peer_id)  # joins at the end of the ring
        joiner: CpShardRole = (await net.add("late", ("cp-shard",), identity=joiner_identity)).role  # type: ignore[assignment]
        await net.start("late")
        await drain([*roles, joiner])

        everyone = [*roles, joiner]
        assert all(role.finished and role.replica.version == 6 for role in everyone)
        joined = [ledger for ledger in joiner.runner.history if ledger.applied]
        assert joined and joined[0].step >= 2 and all(ledger.chunks == 3 for ledger in joined)
        assert [ledger.step for ledger in joined] == list(range(joined[0].step, 6))
        for role in everyone:
            check_ledgers(role)
        assert same_parameters(everyone)
    finally:
        await net.aclose()

"""Real learners in one process (``peer.testing.localnet``): real HTTP between them, signed
messages, one view of signed records. With W1 = W2 = global every learner mixes with both others
in every round, so their replicas stay identical (DiLoCo exactly) and every ledger balances; a
learner whose pseudo-gradient inbox fails for one round records both others as timed out there
and still finishes in step with them; four learners on a ring leave an exact-average round
identical."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gossamer.peer.orchestrator import OrchestratorRole
from gossamer.peer.role import FINISHED
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

pytestmark = pytest.mark.timeout(300)
ROUNDS = 3
RUN = {
    "run": {"name": "learners", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
    "hyper": {"rounds": ROUNDS, "batch_size": 8, "eval_batches": 2, "min_learners": 3, "w1_grace_s": 30.0,
              "w2_deadline_s": 30.0, "diloco": {"inner_steps": 8, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global"}, "aggregator": {"name": "mean"}},
}


async def learners(tmp_path: Path, run: dict, count: int = 3) -> tuple[LocalNet, list[LearnerRole]]:
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=tmp_path)
    roles = [(await net.add(f"l{i}", ("learner",))).role for i in range(count)]
    return net, roles  # type: ignore[return-value]


async def finish(net: LocalNet, roles: list[LearnerRole]) -> None:
    await net.start()
    await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles)), timeout=240)


async def test_three_learners_mix_in_every_round_and_stay_identical(tmp_path: Path) -> None:
    net, roles = await learners(tmp_path, RUN)
    try:
        await finish(net, roles)

        for role in roles:
            assert role.finished and role.round == ROUNDS and len(role.history) == ROUNDS
            for ledger in role.history:
                assert len(ledger.params.used) == 2 and len(ledger.pseudo_gradients.used) == 2, ledger.to_json()
                assert ledger.params.balance_problems() == [] and ledger.pseudo_gradients.balance_problems() == []
            losses = [ledger.heldout_loss for ledger in role.history]
            assert losses[-1] < losses[0], losses
        for t in range(ROUNDS):  # nothing lost on the wire: what all sent for round t is what all accepted
            ledgers = [role.history.get(t) for role in roles]
            assert sum(lg.bytes_sent for lg in ledgers) == sum(lg.bytes_received for lg in ledgers) > 0
            for lg in ledgers:
                parts = (lg.compute_s, lg.w1_wait_s, lg.w2_wait_s, lg.eval_s)
                assert all(part >= 0 for part in parts) and lg.compute_s > 0 and sum(parts) <= lg.wall_s, lg
                assert not lg.partial() and lg.balance_problems() == []
        first = flat_parameters(roles[0].replica.module)
        for role in roles[1:]:
            other = flat_parameters(role.replica.module)
            assert all(torch.allclose(first[k], other[k], atol=1e-6) for k in first)
    finally:
        await net.aclose()


async def test_a_learner_whose_inbox_fails_for_a_round_times_out_there_and_goes_on(tmp_path: Path) -> None:
    run = {**RUN, "hyper": {**RUN["hyper"], "w2_deadline_s": 6.0}}  # l2 waits it out in round 1
    net, roles = await learners(tmp_path, run)
    net.fail("l2", 1, "pgrad")  # l2 refuses every pseudo-gradient sent to it in round 1
    try:
        await finish(net, roles)

        others = sorted(role.peer_id for role in roles[:2])
        round1 = roles[2].history.get(1)
        assert round1 is not None
        assert round1.pseudo_gradients.used == [] and round1.pseudo_gradients.timed_out == others
        assert round1.partial()
        for role in roles[:2]:
            sent = role.history.get(1).pseudo_gradients  # type: ignore[union-attr]
            assert roles[2].peer_id in sent.send_failures, sent.to_json()
            assert role.history.get(1).partial() and not role.history.get(0).partial()  # type: ignore[union-attr]
        for role in roles:
            assert role.finished and role.round == ROUNDS
            for ledger in role.history:
                assert ledger.pseudo_gradients.balance_problems() == [], ledger.to_json()
    finally:
        await net.aclose()


async def test_ring_learners_leave_an_exact_average_round_identical_momentum_included(tmp_path: Path) -> None:
    """Four learners, W1 ring and W2 ring on the embeddings only, private momentum, an exact
    average every second round: round 0 mixes with the two ring neighbours and leaves the learners
    apart (their held-out losses differ); round 1 mixes with everyone over every parameter,
    momentum included, and leaves them identical (each one's own momentum differs after round 0,
    so this needs the momentum averaged too)."""
    mixing = {"w1": "ring", "w2": "ring", "w2_subset": ["embed", "pos"], "average_every": 2}
    run = {**RUN, "hyper": {**RUN["hyper"], "rounds": 2, "min_learners": 4, "mixing": mixing}}
    net, roles = await learners(tmp_path, run, count=4)
    try:
        await finish(net, roles)

        rounds = [(role.history.get(0), role.history.get(1)) for role in roles]
        for ring, exact in rounds:
            assert ring is not None and exact is not None
            assert (len(ring.params.used), len(ring.pseudo_gradients.used)) == (2, 2), ring.to_json()
            assert (len(exact.params.used), len(exact.pseudo_gradients.used)) == (3, 3), exact.to_json()
        assert len({ring.heldout_loss for ring, _ in rounds}) > 1  # apart after the ring round
        first, first_u = flat_parameters(roles[0].replica.module), roles[0].replica.outer.state_dict()
        for role in roles[1:]:
            other, other_u = flat_parameters(role.replica.module), role.replica.outer.state_dict()
            assert all(torch.equal(first[k], other[k]) and torch.equal(first_u[k], other_u[k]) for k in first)
    finally:
        await net.aclose()


async def test_a_learner_that_comes_after_the_run_finished_says_so_instead_of_waiting(tmp_path: Path) -> None:
    """The orchestrator's record keeps the highest round the learners announced (``run_round``);
    once they have finished and left, a new learner reads there that the run is over and ends,
    where before it waited for ``min_learners`` for good."""
    run = {**RUN, "hyper": {**RUN["hyper"], "rounds": 2, "min_learners": 2, "eval_batches": 1,
                            "diloco": {"inner_steps": 2, "inner_lr": 0.003}}}
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=tmp_path, dht=True)
    try:
        owner: OrchestratorRole = (await net.add("owner", ("orchestrator",))).role  # type: ignore[assignment]
        roles: list[LearnerRole] = [(await net.add(f"l{i}", ("learner",))).role for i in range(2)]  # type: ignore[misc]
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles)), timeout=240)
        await net.publish()  # the learners' records say round 2
        assert await net.peers["owner"].ctx.until_view(lambda: owner.run_round == 2, timeout_s=60)
        for name in ("l0", "l1"):
            await net.kill(name)
            net.forget(name)
        await net.publish()  # only the owner is left; its record says run_round = 2

        late: LearnerRole = (await net.add("late", ("learner",))).role  # type: ignore[assignment]
        await net.start("late")
        await asyncio.wait_for(late.drain(), timeout=60)

        assert late.finished and late.ended_before_join == 2 and late.round == 0 and len(late.history) == 0
        health = late.health()
        assert health.state == FINISHED and "finished at round 2 before this learner came" in health.detail
    finally:
        await net.aclose()


async def test_a_learner_left_alone_mid_run_waits_once_for_company_then_trains_on(tmp_path: Path) -> None:
    """With no other learner in view mid-run (its peer died and the record expired), a learner
    waits for one once (``catch_up_rounds`` W2 deadlines) instead of racing on alone, then trains on
    alone to the end."""
    run = {**RUN, "hyper": {**RUN["hyper"], "rounds": 4, "min_learners": 2, "eval_batches": 1, "w2_deadline_s": 1.0,
                            "w1_grace_s": 1.0, "diloco": {"inner_steps": 2, "inner_lr": 0.003}}}
    net, (l0, l1) = await learners(tmp_path, run, count=2)
    try:
        await net.start()
        assert await net.peers["l0"].ctx.until_view(lambda: l0.round >= 1, timeout_s=120)
        await net.kill("l1")
        net.forget("l1")
        await net.publish()
        await asyncio.wait_for(l0.drain(), timeout=240)

        assert l0.finished and l0.round == 4 and l0.alone_waited
        assert l1.round < 4
    finally:
        await net.aclose()

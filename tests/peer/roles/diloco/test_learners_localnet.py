"""Three real learners in one process (``peer.testing.localnet``): real HTTP between them, signed
messages, one view of signed records. With W1 = W2 = global every learner mixes with both others
in every round, so their replicas stay identical (DiLoCo exactly) and every ledger balances; a
learner whose pseudo-gradient inbox fails for one round records both others as timed out there
and still finishes in step with them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gossamer.peer.roles import PLUGINS
from gossamer.peer.roles.diloco.learner import LearnerRole
from gossamer.peer.testing.localnet import LocalNet
from gossamer.protocols.models import flat_parameters

pytestmark = pytest.mark.timeout(300)
ROUNDS = 3
RUN = {
    "run": {"name": "learners", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
    "hyper": {"rounds": ROUNDS, "batch_size": 8, "eval_batches": 2, "min_learners": 3, "w1_grace_s": 30.0,
              "w2_deadline_s": 30.0, "diloco": {"inner_steps": 8, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global"}, "aggregator": {"name": "mean"}},
}


async def learners(tmp_path: Path, run: dict) -> tuple[LocalNet, list[LearnerRole]]:
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=tmp_path)
    roles = [(await net.add(f"l{i}", ("learner",))).role for i in range(3)]
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

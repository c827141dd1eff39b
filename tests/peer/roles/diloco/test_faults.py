"""Faults injected by (peer, round, phase) into six learners on LocalNet (``fail``/``slow``/
``crash``), one or two per round, with an exact-average round at the end:

- round 0: l4's pseudo-gradients are slow to arrive (inside the deadline: used by everyone);
- round 1, a pair: l3 crashes mid-send, after one of its pseudo-gradients went out, and l5
  crashes mid-aggregate (it received the round's pseudo-gradients, it never applied them);
- round 2, a pair: l4 crashes before the round's exchange and l2 sends slowly.

The crashed peers' records expire at once (a run with a short TTL), so the survivors stop waiting
for them (adaptive pacing, its floor at the deadline so that only that changes). Pass: every survivor finishes, every ledger balances, from round 2 on each survivor used
exactly the other survivors' parameters and pseudo-gradients (the protocol's result over the
survivors), none sat out a deadline, and after the exact-average round the survivors' parameters
and outer momentum are bit-identical. And every survivor's every round is recomputed from the
protocol's pure functions (``protocols.learner_round``) over exactly the contributions its ledger
says it used, as they were sent (the net keeps every body a peer sent), starting from its state at
the end of the round before: its applied parameters and momentum are within 1e-5 of it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gossamer.peer.roles import PLUGINS
from gossamer.peer.roles.diloco.learner import LearnerRole
from gossamer.peer.roles.diloco.recheck import RoundStates, recheck
from gossamer.peer.testing.localnet import LocalNet
from gossamer.protocols.models import flat_parameters

pytestmark = pytest.mark.timeout(300)
ROUNDS = 4
DEADLINE_S = 60.0
RUN = {
    "run": {"name": "faults", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "hyper": {"rounds": ROUNDS, "batch_size": 4, "eval_batches": 1, "min_learners": 6, "w1_grace_s": DEADLINE_S,
              "w2_deadline_s": DEADLINE_S, "pacing": "adaptive", "w2_floor_s": DEADLINE_S, "diloco": {"inner_steps": 2, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global", "average_every": 2}, "aggregator": {"name": "mean"}},
}


async def test_crashes_and_slow_sends_by_peer_round_and_phase_leave_the_survivors_in_agreement(tmp_path: Path) -> None:
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=tmp_path, keep_sent=True)
    roles: list[LearnerRole] = [(await net.add(f"l{i}", ("learner",))).role for i in range(6)]  # type: ignore[misc]
    ids = {f"l{i}": role.peer_id for i, role in enumerate(roles)}
    states = RoundStates({f"l{i}": role for i, role in enumerate(roles)})
    net.watchers.append(states)
    net.slow("l4", 0.5, op="pgrad", step=0)
    net.crash("l3", 1, "pgrad", after=1, expire=True)
    net.crash("l5", 1, "aggregate", expire=True)
    net.crash("l4", 2, "params", expire=True)
    net.slow("l2", 0.5, op="pgrad", step=2)
    survivors = roles[:3]
    try:
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in survivors)), timeout=240)

        assert not net["l3"].alive and not net["l4"].alive and not net["l5"].alive
        l5 = roles[5].replica  # died between its round-1 pseudo-gradient and the outer step
        assert (l5.round, l5.phase) == (1, "outer") and ("l5", 0) in states.states and ("l5", 1) not in states.states
        got_l3 = []
        for role in survivors:
            assert role.finished and role.round == ROUNDS
            others = sorted(r.peer_id for r in survivors if r is not role)
            for t in range(ROUNDS):
                ledger = role.history.get(t)
                assert ledger is not None and ledger.balance_problems() == [], ledger
                assert ledger.w2_wait_s < DEADLINE_S and ledger.w1_wait_s < DEADLINE_S, ledger.to_json()
            round0, round1 = role.history.get(0), role.history.get(1)
            assert ids["l4"] in round0.pseudo_gradients.used, round0.to_json()  # type: ignore[union-attr]
            got_l3.append(ids["l3"] in round1.pseudo_gradients.used)  # type: ignore[union-attr]
            for t in (2, 3):
                ledger = role.history.get(t)
                assert ledger.params.used == others and ledger.pseudo_gradients.used == others, ledger.to_json()  # type: ignore[union-attr]
        assert sum(got_l3) <= 1  # one of l3's four pseudo-gradients went out before it crashed
        first, first_u = flat_parameters(survivors[0].replica.module), survivors[0].replica.outer.state_dict()
        for role in survivors[1:]:
            other, other_u = flat_parameters(role.replica.module), role.replica.outer.state_dict()
            assert all(torch.equal(first[k], other[k]) and torch.equal(first_u[k], other_u[k]) for k in first)
        names = {peer_id: name for name, peer_id in ids.items()}
        for name in ("l0", "l1", "l2"):
            for t in range(ROUNDS):
                assert recheck(name, t, states=states, sent=net.sent.tensors, names=names) <= 1e-5, (name, t)  # type: ignore[union-attr]
    finally:
        await net.aclose()

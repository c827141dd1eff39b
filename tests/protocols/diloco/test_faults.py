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
protocol's pure functions (``protocols.diloco.core.learner_round``) over exactly the contributions its ledger
says it used, as they were sent (the net keeps every body a peer sent), starting from its state at
the end of the round before: its applied parameters and momentum are within 1e-5 of it.

Then the same recomputation for the runs users configure: five learners, l4 crashing mid-send in
round 1, under the default W2 aggregator (the geometric median), trimmed mean and Krum (f = 1:
with l4's pseudo-gradient missing Krum cannot run and the round degrades to the coordinate-wise
median; with four learners left f = 1 no longer fits and each learner keeps its own
pseudo-gradient), and with clipped W1 (``w1_clip_tau``, under the mean and the geometric median,
W2 on a ring so the learners drift apart and the clipping bites). In each, every survivor's every
round is within 1e-5 of the recomputation, and the check fails when the recomputation is moved by
2e-5 or when one pseudo-gradient the ledger used is changed by 1e-3."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.core.robust import DEFAULT, flatten
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.diloco.recheck import RoundStates, recheck
from gossamer_harness.localnet import LocalNet

pytestmark = pytest.mark.timeout(300)
ROUNDS = 4
DEADLINE_S = 60.0
RUN = {
    "run": {"name": "faults", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "hyper": {"rounds": ROUNDS, "batch_size": 4, "eval_batches": 1, "min_learners": 6, "w1_grace_s": DEADLINE_S,
              "w2_deadline_s": DEADLINE_S, "pacing": "adaptive", "w2_floor_s": DEADLINE_S, "diloco": {"inner_steps": 2, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global", "average_every": 2}, "aggregator": {"name": "mean"},
              "w1_clip_ratio": 0.0},  # the plain W1 mix: only it keeps survivors bit for bit in agreement
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


ROBUST_ROUNDS = 3
TAU = 1e-3  # W1 clipping radius: well under the learners' spread once W2 on a ring has moved them apart
CASES = {
    "geometric_median_default": ({}, 0.0, "global"),
    "trimmed_mean_f1": ({"name": "trimmed_mean", "f": 1}, 0.0, "global"),
    "krum_f1_degrades": ({"name": "krum", "f": 1}, 0.0, "global"),
    "clipped_w1_mean": ({"name": "mean"}, TAU, "ring"),
    "clipped_w1_geometric_median": ({"name": "geometric_median"}, TAU, "ring"),
}


def robust_run(aggregator: dict[str, Any], w1_clip_tau: float, w2: str) -> dict[str, Any]:
    hyper: dict[str, Any] = {**RUN["hyper"], "rounds": ROBUST_ROUNDS, "min_learners": 5, "w1_clip_tau": w1_clip_tau,
                             "mixing": {"w1": "global", "w2": w2, "average_every": 2}, "aggregator": aggregator}
    if not aggregator:
        del hyper["aggregator"]  # the manifest names none: the run's default
    return {**RUN, "hyper": hyper}


@pytest.mark.parametrize("case", list(CASES))
async def test_robust_w2_and_clipped_w1_rounds_recompute_after_a_crash_mid_send(tmp_path: Path, case: str) -> None:
    aggregator, tau, w2 = CASES[case]
    net = await LocalNet.create(robust_run(aggregator, tau, w2), plugins=PLUGINS, workdir=tmp_path, keep_sent=True)
    roles = {f"l{i}": (await net.add(f"l{i}", ("learner",))).role for i in range(5)}
    states = RoundStates(roles)  # type: ignore[arg-type]
    net.watchers.append(states)
    net.crash("l4", 1, "pgrad", after=1, expire=True)
    survivors: dict[str, LearnerRole] = {name: role for name, role in roles.items() if name != "l4"}  # type: ignore[misc]
    try:
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in survivors.values())), timeout=240)

        names = {net[name].peer_id: name for name in net.peers}
        assert not net["l4"].alive
        assert survivors["l0"].settings.aggregator == (aggregator.get("name") or DEFAULT)
        for name, role in survivors.items():
            assert role.finished and role.round == ROBUST_ROUNDS
            for t in range(ROBUST_ROUNDS):
                ledger = role.history.get(t)
                assert ledger is not None and ledger.balance_problems() == [], ledger.to_json()
                assert recheck(name, t, states=states, sent=net.sent.tensors, names=names) <= 1e-5, (name, t)  # type: ignore[union-attr]
                assert recheck(name, t, states=states, sent=net.sent.tensors, names=names, perturb=2e-5) > 1e-5  # type: ignore[union-attr]
        notes = [role.history.get(t).note for role in survivors.values() for t in range(ROBUST_ROUNDS)]  # type: ignore[union-attr]
        if case == "krum_f1_degrades":
            assert any(n.startswith("degraded to the coordinate-wise median") for n in notes), notes
            assert any(n.startswith("aggregation fell back to the own pseudo-gradient") for n in notes), notes
        else:
            assert notes == [""] * len(notes)
        if tau:
            assert _largest_w1_distance(survivors, states, net.sent.tensors, names) > tau  # type: ignore[union-attr]
        name, t, sender = next((name, t, role.history.get(t).pseudo_gradients.used[0])  # type: ignore[union-attr]
                               for name, role in survivors.items() for t in range(ROBUST_ROUNDS)
                               if role.history.get(t).pseudo_gradients.used)  # type: ignore[union-attr]
        assert _fails(lambda: recheck(name, t, states=states, sent=_tampered(net.sent.tensors, names[sender], t),  # type: ignore[union-attr]
                                      names=names))
    finally:
        await net.aclose()


def _tampered(sent: Callable[[str, str, str], dict[str, torch.Tensor]], sender: str,
              round: int) -> Callable[[str, str, str], dict[str, torch.Tensor]]:
    """``sent``, with ``sender``'s pseudo-gradients of ``round`` moved by 1e-3 everywhere."""
    def tensors(who: str, recipient: str, path: str) -> dict[str, torch.Tensor]:
        got = sent(who, recipient, path)
        return {k: v + 1e-3 for k, v in got.items()} if (who, path) == (sender, f"/diloco/pgrad/{round}") else got
    return tensors


def _fails(check: Callable[[], float]) -> bool:
    """Whether a recheck finds the round off: a gap past 1e-5, or a ledger that disagrees with the rule."""
    try:
        return check() > 1e-5
    except ValueError:
        return True


def _largest_w1_distance(survivors: dict[str, LearnerRole], states: RoundStates,
                         sent: Callable[[str, str, str], dict[str, torch.Tensor]], names: dict[str, str]) -> float:
    """The largest L2 distance from a survivor's parameters to a neighbour's it mixed (clipping bites past tau)."""
    distances = [0.0]
    for name, role in survivors.items():
        for t in range(ROBUST_ROUNDS):
            own = flatten(states.states[name, t - 1][0])
            for sender in role.history.get(t).params.used:  # type: ignore[union-attr]
                theirs = sent(names[sender], name, f"/diloco/params/{t}")
                theirs = {k: v for k, v in theirs.items() if k in states.states[name, t - 1][0]}
                distances.append(float(torch.linalg.vector_norm(flatten(theirs) - own)))
    return max(distances)

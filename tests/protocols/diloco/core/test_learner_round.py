"""``learner_round.round_result``: one learner's round recomputed from what it used equals what
``mixing.simulate_round`` (the whole round of every replica, composed independently) applied,
with contributions missing, a W2 subset, and in an exact-average round that mixes momentum."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.diloco.core.learner_round import RoundInputs, round_result
from gossamer.protocols.diloco.core.mixing import MixingPlan, simulate_round
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica
from tests.protocols.diloco.core.test_replica import make_mlp, mse, regression_batch

ARRIVED_W1 = {0, 1, 3}
ARRIVED_W2 = {0, 2, 3}


@pytest.mark.parametrize("round", [1, 2], ids=["exact-round", "plain-round"])
def test_a_recomputed_round_is_what_the_replicas_applied(round: int) -> None:
    config = DilocoConfig(inner_steps=2, inner_lr=1e-2)
    plan = MixingPlan(w1="ring", w2="global", w2_subset=("0",), average_every=2)
    replicas = [DilocoReplica(make_mlp(seed=i), config) for i in range(4)]
    for t in range(round):
        simulate_round(replicas, regression_batch, plan, round=t, seed=3, loss_fn=mse)
    seen: dict[str, list] = {}

    simulate_round(replicas, regression_batch, plan, round=round, seed=3, loss_fn=mse, arrived_w1=ARRIVED_W1,
                   arrived_w2=ARRIVED_W2, trace=lambda stage, values: seen.setdefault(stage, list(values)))

    assert plan.mixes_momentum(round) == (round == 1)
    for i in range(4):
        used = RoundInputs(me=i, n=4, x=seen["x"][i], u=seen["u"][i], d=seen["d"][i],
                           params={j: seen["x"][j] for j in ARRIVED_W1 - {i}},
                           momenta={j: seen["u"][j] for j in ARRIVED_W1 - {i}},
                           pgrads={j: seen["d"][j] for j in ARRIVED_W2 - {i}})
        x_next, u_next = round_result(used, round=round, seed=3, plan=plan, config=config)
        for name in x_next:
            torch.testing.assert_close(x_next[name], seen["x_next"][i][name], rtol=0, atol=1e-6)
            torch.testing.assert_close(u_next[name], seen["u_next"][i][name], rtol=0, atol=1e-6)


def test_leaving_out_one_contribution_changes_the_result() -> None:
    config = DilocoConfig(inner_steps=2, inner_lr=1e-2)
    plan = MixingPlan(w1="global", w2="global")
    replicas = [DilocoReplica(make_mlp(seed=i), config) for i in range(3)]
    seen: dict[str, list] = {}
    simulate_round(replicas, regression_batch, plan, round=0, seed=0, loss_fn=mse,
                   trace=lambda stage, values: seen.setdefault(stage, list(values)))

    def result(pgrads_from: set[int]) -> dict[str, torch.Tensor]:
        used = RoundInputs(me=0, n=3, x=seen["x"][0], u=seen["u"][0], d=seen["d"][0],
                           params={1: seen["x"][1], 2: seen["x"][2]}, pgrads={j: seen["d"][j] for j in pgrads_from})
        return round_result(used, round=0, seed=0, plan=plan, config=config)[0]

    full, short = result({1, 2}), result({1})
    assert all(torch.equal(full[name], seen["x_next"][0][name]) for name in full)
    assert max(float((full[name] - short[name]).abs().max()) for name in full) > 1e-4

"""Mixing: topologies (stochasticity, symmetry, determinism), mix against the exact weighted average
and closed forms under missing contributions, subset mixing, and simulate_round end to end."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates, ProtocolError
from gossamer.protocols.core.settings import read_table
from gossamer.protocols.diloco.core.mixing import MixingPlan, mix, mixing_weights, neighbours, simulate_round
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica
from tests.protocols.diloco.core.test_replica import make_mlp, mse, regression_batch


def random_params(n: int, seed: int = 0) -> dict[int, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return {j: {"a": torch.randn(3, 5, generator=gen), "b": torch.randn(7, generator=gen)} for j in range(n)}


def exact_average(contribs, row: torch.Tensor, name: str) -> torch.Tensor:
    """Float64 reference: sum_j row_j v_j / sum_j row_j over the given contributions."""
    used = [j for j in contribs if row[j] > 0]
    total = sum(float(row[j]) for j in used)
    return sum(float(row[j]) / total * contribs[j][name].double() for j in used)


# --- topologies --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["global", "ring", "random_k", "none"])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_every_topology_is_doubly_stochastic_and_symmetric(kind: str, n: int) -> None:
    w = mixing_weights(kind, n, round=3, seed=11, k=3)

    assert w.dtype == torch.float64 and w.shape == (n, n) and bool((w >= 0).all())
    torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(w.sum(0), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(w, w.T)


def test_global_none_and_ring_entries() -> None:
    assert torch.equal(mixing_weights("global", 4, round=0, seed=0), torch.full((4, 4), 0.25, dtype=torch.float64))
    assert torch.equal(mixing_weights("none", 3, round=0, seed=0), torch.eye(3, dtype=torch.float64))
    assert torch.equal(mixing_weights("ring", 1, round=0, seed=0), torch.ones(1, 1, dtype=torch.float64))
    assert torch.equal(mixing_weights("ring", 2, round=0, seed=0), torch.full((2, 2), 0.5, dtype=torch.float64))
    ring = mixing_weights("ring", 6, round=0, seed=0)
    assert neighbours(ring[0]) == [0, 1, 5] and neighbours(ring[3]) == [2, 3, 4]
    assert ring[0, 1] == pytest.approx(1 / 3)


def test_random_k_is_deterministic_per_seed_and_round_and_redrawn_each_round() -> None:
    draws = [mixing_weights("random_k", 10, round=r, seed=5, k=2) for r in range(4)]

    again = mixing_weights("random_k", 10, round=2, seed=5, k=2)
    other_seed = mixing_weights("random_k", 10, round=2, seed=6, k=2)

    assert torch.equal(draws[2], again)
    assert not torch.equal(draws[2], other_seed)
    assert len({tuple(d.flatten().tolist()) for d in draws}) == 4


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_random_k_degree_is_at_most_k_and_graph_connected_for_k_at_least_2(k: int) -> None:
    n = 9
    w = mixing_weights("random_k", n, round=1, seed=3, k=k)
    adj = (w > 0) & ~torch.eye(n, dtype=torch.bool)

    degrees = adj.sum(1)
    reach = torch.linalg.matrix_power((adj | torch.eye(n, dtype=torch.bool)).double(), n)

    assert int(degrees.max()) <= k and int(degrees.min()) >= (1 if k >= 2 else 0)
    assert bool((reach > 0).all()) == (k >= 2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"kind": "star"}, "topology"), ({"n": 0}, "n"), ({"k": 0}, "k"), ({"seed": -1}, "seed")],
)
def test_mixing_weights_rejects_bad_settings(kwargs: dict, field: str) -> None:
    args = {"kind": "random_k", "n": 4, "round": 0, "seed": 0, "k": 2} | kwargs
    kind, n = args.pop("kind"), args.pop("n")
    with pytest.raises(InvalidSetting, match=field):
        mixing_weights(kind, n, **args)


# --- mix ---------------------------------------------------------------------------------------


def test_mix_matches_exact_weighted_average() -> None:
    n = 5
    gen = torch.Generator().manual_seed(1)
    w = torch.rand(n, n, generator=gen, dtype=torch.float64)
    w /= w.sum(1, keepdim=True)
    contribs = random_params(n)

    out, report = mix(2, contribs, w)

    for name in ("a", "b"):
        torch.testing.assert_close(out[name].double(), exact_average(contribs, w[2], name), rtol=0, atol=1e-6)
    assert report.used == (0, 1, 2, 3, 4) and report.dropped == ()
    assert sum(report.weights) == pytest.approx(1.0)


def test_missing_contributions_are_dropped_and_row_renormalised() -> None:
    w = torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.4, 0.3], [0.2, 0.3, 0.5]], dtype=torch.float64)
    full = random_params(3)
    arrived = {0: full[0], 2: full[2]}

    out, report = mix(0, arrived, w)

    want = (0.5 * full[0]["a"].double() + 0.2 * full[2]["a"].double()) / 0.7
    torch.testing.assert_close(out["a"].double(), want, rtol=0, atol=1e-6)
    assert report.used == (0, 2) and report.dropped == (1,)
    assert report.weights == pytest.approx((5 / 7, 2 / 7))


def test_non_neighbours_are_ignored_not_dropped() -> None:
    ring = mixing_weights("ring", 6, round=0, seed=0)
    contribs = random_params(6)

    out, report = mix(0, {j: contribs[j] for j in (0, 1, 3)}, ring)

    assert report.used == (0, 1) and report.dropped == (5,)
    torch.testing.assert_close(out["b"], (contribs[0]["b"] + contribs[1]["b"]) / 2)


def test_subset_mixing_leaves_other_parameters_untouched() -> None:
    contribs = random_params(4)
    w = mixing_weights("global", 4, round=0, seed=0)

    out, _ = mix(1, contribs, w, names=["a"])

    assert out["b"] is contribs[1]["b"]
    assert not torch.equal(out["a"], contribs[1]["a"])


def test_global_mix_of_arbitrary_inputs_is_the_mean() -> None:
    contribs = random_params(7, seed=4)
    w = mixing_weights("global", 7, round=0, seed=0)

    out, report = mix(3, contribs, w)

    for name in ("a", "b"):
        torch.testing.assert_close(out[name], torch.stack([c[name] for c in contribs.values()]).mean(0))
    assert report.weights == pytest.approx((1 / 7,) * 7)


@pytest.mark.parametrize("kind", ["global", "random_k"])
def test_mix_of_identical_inputs_returns_them_exactly(kind: str) -> None:
    gen = torch.Generator().manual_seed(2)
    x = {"a": torch.randn(1000, generator=gen)}
    w = mixing_weights(kind, 8, round=0, seed=1, k=3)

    out, _ = mix(0, {j: {"a": x["a"].clone()} for j in range(8)}, w)

    assert torch.equal(out["a"], x["a"])


def test_mix_keeps_dtype_and_accepts_contributions_of_another_dtype() -> None:
    own = {"a": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}
    other = {"a": torch.tensor([3.0, 4.0])}

    out, _ = mix(0, {0: own, 1: other}, mixing_weights("global", 2, round=0, seed=0))

    assert out["a"].dtype == torch.bfloat16 and out["a"].tolist() == [2.0, 3.0]


def test_mix_errors() -> None:
    contribs = random_params(2)
    w = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
    with pytest.raises(NotEnoughUpdates):
        mix(0, {0: contribs[0]}, w)
    with pytest.raises(ProtocolError, match="own contribution"):
        mix(0, {1: contribs[1]}, w)
    with pytest.raises(ProtocolError, match="shape"):
        mix(1, {0: {"a": torch.zeros(2), "b": contribs[0]["b"]}, 1: contribs[1]}, w)
    with pytest.raises(InvalidSetting, match="square"):
        mix(0, contribs, torch.ones(2, 3, dtype=torch.float64))


# --- plan --------------------------------------------------------------------------------------


def test_plan_from_a_manifest_table_and_dotted_prefix_subset() -> None:
    plan = read_table(MixingPlan, {"w1": "global", "w2": "ring", "w2_subset": ["embed", "blocks.0", "norm_f"]},
                      path="hyper.mixing")

    names = ["embed.weight", "blocks.0.attn.w", "blocks.01.w", "blocks.1.mlp.w", "norm_f.weight", "head.weight"]

    assert plan.w2_subset == ("embed", "blocks.0", "norm_f")
    assert plan.w2_names(names) == ["embed.weight", "blocks.0.attn.w", "norm_f.weight"]
    assert MixingPlan().w2_names(names) == names


@pytest.mark.parametrize(
    ("d", "field"),
    [({"w3": "ring"}, "w3"), ({"w1": "star"}, "w1"), ({"w2_subset": [""]}, "w2_subset"), ({"k": 0}, "k"),
     ({"mix_momentum": 1}, "mix_momentum"), ({"average_every": -1}, "average_every"),
     ({"average_every": True}, "average_every"), ({"average_every": 2.0}, "average_every"),
     ({"w2_subset": "embed"}, "w2_subset"), ({"w2_subset": 3}, "w2_subset")],
)
def test_plan_rejects_bad_settings(d: dict, field: str) -> None:
    with pytest.raises(InvalidSetting, match=f"hyper.mixing.*{field}"):
        read_table(MixingPlan, d, path="hyper.mixing")
    if field != "w3":  # a plan built in code is checked by the same rules
        with pytest.raises(InvalidSetting, match=field):
            MixingPlan(**d)


def test_every_kth_round_is_an_exact_average_over_every_parameter() -> None:
    plan = MixingPlan(w1="ring", w2="ring", w2_subset=("0",), mix_momentum=False, average_every=3)
    glob = mixing_weights("global", 5, round=0, seed=0)

    exact = [t for t in range(9) if plan.exact_round(t)]

    assert exact == [2, 5, 8]
    for t in range(9):
        is_exact = t in exact
        assert torch.equal(plan.w1_weights(5, round=t, seed=1), glob) is is_exact
        assert torch.equal(plan.w2_weights(5, round=t, seed=1), glob) is is_exact
        assert plan.w2_names(["0.weight", "2.weight"], round=t) == (["0.weight", "2.weight"] if is_exact else ["0.weight"])
        assert plan.mixes_momentum(t) is is_exact
    assert not any(MixingPlan().exact_round(t) for t in range(9))


def test_plan_draws_w1_and_w2_independently() -> None:
    plan = MixingPlan(w1="random_k", w2="random_k")
    assert not torch.equal(plan.w1_weights(10, round=0, seed=0), plan.w2_weights(10, round=0, seed=0))


# --- simulate_round ----------------------------------------------------------------------------


def held_out_loss(replicas: list[DilocoReplica]) -> float:
    x, y = regression_batch(99, 0, 0, size=256)
    with torch.no_grad():
        return sum(float(mse(r.module(x), y)) for r in replicas) / len(replicas)


@pytest.mark.parametrize(
    "plan",
    [MixingPlan(w1="global", w2="global"), MixingPlan(w1="global", w2="ring", w2_subset=("0",))],
    ids=["global-global", "global-ring-subset"],
)
def test_simulated_rounds_reduce_the_loss(plan: MixingPlan) -> None:
    cfg = DilocoConfig(inner_steps=10, inner_lr=2e-2, inner_weight_decay=0.0)
    replicas = [DilocoReplica(make_mlp(hidden=16), cfg) for _ in range(4)]
    start = held_out_loss(replicas)

    for t in range(5):
        simulate_round(replicas, regression_batch, plan, round=t, seed=0, loss_fn=mse)

    assert held_out_loss(replicas) < 0.25 * start


def test_outer_momentum_stays_local_unless_shared_ablation() -> None:
    cfg = DilocoConfig(inner_steps=2, inner_lr=1e-2)
    plan = MixingPlan(w1="global", w2="none")
    local = [DilocoReplica(make_mlp(), cfg) for _ in range(3)]
    shared = [DilocoReplica(make_mlp(), cfg) for _ in range(3)]

    for t in range(2):
        simulate_round(local, regression_batch, plan, round=t, seed=0, loss_fn=mse)
        simulate_round(shared, regression_batch, plan, round=t, seed=0, loss_fn=mse, shared_momentum=True)

    u_local = [r.outer.state_dict()["0.weight"] for r in local]
    u_shared = [r.outer.state_dict()["0.weight"] for r in shared]
    assert not torch.equal(u_local[0], u_local[1]) and not torch.equal(u_local[1], u_local[2])
    assert torch.equal(u_shared[0], u_shared[1]) and torch.equal(u_shared[1], u_shared[2])


def test_an_exact_round_leaves_every_replica_identical_momentum_included() -> None:
    cfg = DilocoConfig(inner_steps=3, inner_lr=1e-2)
    plan = MixingPlan(w1="ring", w2="ring", w2_subset=("0",), mix_momentum=False, average_every=2)
    replicas = [DilocoReplica(make_mlp(), cfg) for _ in range(5)]

    simulate_round(replicas, regression_batch, plan, round=0, seed=0, loss_fn=mse)
    apart = [r.parameters_snapshot()["2.weight"] for r in replicas]
    simulate_round(replicas, regression_batch, plan, round=1, seed=0, loss_fn=mse)

    assert not torch.equal(apart[0], apart[1])
    params = [r.parameters_snapshot() for r in replicas]
    momenta = [r.outer.state_dict() for r in replicas]
    for name in params[0]:
        assert all(torch.equal(p[name], params[0][name]) for p in params)
        assert all(torch.equal(u[name], momenta[0][name]) for u in momenta)


def test_mixed_momentum_is_the_w1_mix_of_the_round_start_momentum() -> None:
    cfg = DilocoConfig(inner_steps=2, inner_lr=1e-2)
    plan = MixingPlan(w1="ring", w2="none", mix_momentum=True)
    replicas = [DilocoReplica(make_mlp(), cfg) for _ in range(4)]
    simulate_round(replicas, regression_batch, plan, round=0, seed=0, loss_fn=mse)
    seen: dict[str, list] = {}

    simulate_round(replicas, regression_batch, plan, round=1, seed=0, loss_fn=mse,
                   trace=lambda stage, values: seen.setdefault(stage, list(values)))

    assert list(seen) == ["x", "u", "m", "u_mixed", "d", "d_mixed", "x_next", "u_next"]
    w1 = plan.w1_weights(4, round=1, seed=0)
    for i, replica in enumerate(replicas):
        want_u = mix(i, dict(enumerate(seen["u"])), w1)[0]
        # u_next = mu u~ + d (W2 = none: d~ = d)
        for name, u in replica.outer.state_dict().items():
            torch.testing.assert_close(seen["u_mixed"][i][name], want_u[name])
            torch.testing.assert_close(u, cfg.outer_momentum * want_u[name] + seen["d"][i][name])


def test_dropped_pseudo_gradients_do_not_reach_the_others() -> None:
    cfg = DilocoConfig(inner_steps=2, inner_lr=1e-2)
    plan = MixingPlan(w1="none", w2="global")
    with_all = [DilocoReplica(make_mlp(), cfg) for _ in range(3)]
    without_2 = [DilocoReplica(make_mlp(), cfg) for _ in range(3)]
    only_0_and_1 = [DilocoReplica(make_mlp(), cfg) for _ in range(2)]

    simulate_round(with_all, regression_batch, plan, round=0, seed=0, loss_fn=mse)
    simulate_round(without_2, regression_batch, plan, round=0, seed=0, loss_fn=mse, arrived_w2={0, 1})
    simulate_round(only_0_and_1, regression_batch, plan, round=0, seed=0, loss_fn=mse)

    p = [r.parameters_snapshot()["2.weight"] for r in (without_2[0], only_0_and_1[0], with_all[0])]
    assert torch.equal(p[0], p[1]) and not torch.equal(p[0], p[2])

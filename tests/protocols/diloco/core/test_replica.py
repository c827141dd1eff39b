"""DiLoCo pieces: config, pseudo-gradient, outer Nesterov (hand computation), the replica state
machine, and bit-identity of Gossip DiLoCo with W1 = W2 = global against a plain DiLoCo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gossamer.protocols.core.errors import InvalidSetting, ProtocolError
from gossamer.protocols.core.settings import read_table
from gossamer.protocols.diloco.core.mixing import MixingPlan, simulate_round
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica, OuterNesterov, pseudo_gradient

IN_FEATURES = 4


def make_mlp(seed: int = 0, hidden: int = 8) -> nn.Module:
    """A 2-layer MLP whose initial weights come from an explicit generator."""
    model = nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


TRUE_W = torch.tensor([[1.5], [-2.0], [0.5], [1.0]])


def regression_batch(worker: int, round: int, step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch of y = x W* + 0.3 per (worker, round, step)."""
    gen = torch.Generator().manual_seed(100_000 * worker + 1_000 * round + step)
    x = torch.randn(size, IN_FEATURES, generator=gen)
    return x, x @ TRUE_W + 0.3


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


# --- config ------------------------------------------------------------------------------------


def test_config_defaults_and_a_manifest_table() -> None:
    cfg = read_table(DilocoConfig, {"inner_steps": 10, "inner_betas": [0.8, 0.99], "nesterov": False},
                     path="hyper.diloco")
    assert (cfg.inner_steps, cfg.inner_betas, cfg.nesterov) == (10, (0.8, 0.99), False)
    assert DilocoConfig().outer_lr == 0.7 and DilocoConfig().inner_steps == 50
    assert DilocoConfig(inner_lr=1, inner_betas=[0, 0.5]).inner_betas == (0.0, 0.5)  # ints as floats, a list as a tuple


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("inner_steps", 0),
        ("inner_steps", 2.5),
        ("inner_lr", 0.0),
        ("inner_lr", float("nan")),
        ("inner_weight_decay", -0.1),
        ("inner_betas", (0.9,)),
        ("inner_betas", (0.9, 1.0)),
        ("grad_clip", -1.0),
        ("outer_lr", -0.7),
        ("outer_momentum", 1.0),
        ("nesterov", 1),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidSetting, match=field):
        DilocoConfig(**{field: value})


def test_a_manifest_table_with_an_unknown_key_is_refused_naming_it() -> None:
    with pytest.raises(InvalidSetting, match=r"hyper.diloco: unknown keys \['outer_lrr'\]"):
        read_table(DilocoConfig, {"outer_lrr": 0.5}, path="hyper.diloco")


# --- pseudo-gradient and outer step ------------------------------------------------------------


def test_pseudo_gradient_is_x_minus_y() -> None:
    x = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
    y = {"a": torch.tensor([0.5, 2.5]), "b": torch.tensor([1.0])}
    d = pseudo_gradient(x, y)
    assert torch.equal(d["a"], torch.tensor([0.5, -0.5])) and torch.equal(d["b"], torch.tensor([2.0]))


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_step_matches_hand_computation_for_two_steps(nesterov: bool) -> None:
    opt = OuterNesterov(lr=0.5, momentum=0.9, nesterov=nesterov)
    m1, d1 = {"w": torch.tensor([1.0, -2.0])}, {"w": torch.tensor([0.2, 0.4])}
    m2, d2 = {"w": torch.tensor([0.5, 1.0])}, {"w": torch.tensor([-0.1, 0.3])}

    x1 = opt.step(m1, d1)
    x2 = opt.step(m2, d2)

    # u1 = d1 = [0.2, 0.4]; u2 = 0.9 u1 + d2 = [0.08, 0.66]
    if nesterov:  # x = m - eta (d + mu u)
        want1 = [1.0 - 0.5 * (0.2 + 0.18), -2.0 - 0.5 * (0.4 + 0.36)]
        want2 = [0.5 - 0.5 * (-0.1 + 0.072), 1.0 - 0.5 * (0.3 + 0.594)]
    else:  # x = m - eta u
        want1 = [1.0 - 0.1, -2.0 - 0.2]
        want2 = [0.5 - 0.04, 1.0 - 0.33]
    torch.testing.assert_close(x1["w"], torch.tensor(want1))
    torch.testing.assert_close(x2["w"], torch.tensor(want2))
    torch.testing.assert_close(opt.state_dict()["w"], torch.tensor([0.08, 0.66]))


def test_outer_step_from_a_mixed_momentum_replaces_the_own_buffer() -> None:
    opt = OuterNesterov(lr=0.5, momentum=0.9)
    opt.step({"w": torch.zeros(2)}, {"w": torch.tensor([1.0, 1.0])})  # own u = [1, 1]
    u_mixed = {"w": torch.tensor([0.2, -0.4])}

    x = opt.step({"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([0.1, 0.3])}, u_mixed)

    # u = 0.9 u~ + d = [0.28, -0.06]; x = m - 0.5 (d + 0.9 u)
    torch.testing.assert_close(opt.state_dict()["w"], torch.tensor([0.28, -0.06]))
    torch.testing.assert_close(x["w"], torch.tensor([1.0 - 0.5 * (0.1 + 0.252), 2.0 - 0.5 * (0.3 - 0.054)]))
    with pytest.raises(ProtocolError, match="u_mixed"):
        opt.step({"w": torch.zeros(2)}, {"w": torch.zeros(2)}, {"v": torch.zeros(2)})


def test_momentum_snapshot_is_zero_before_the_first_step_then_the_buffer() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=2, inner_lr=1e-2))
    replica.begin_round()
    before = replica.momentum_snapshot()
    assert before.keys() == replica.snapshot.keys() and all(not t.any() for t in before.values())
    for step in range(2):
        replica.inner_step(*regression_batch(0, 0, step), mse)
    d = replica.end_inner()
    replica.finish_round(replica.snapshot, d)

    replica.begin_round()
    after = replica.momentum_snapshot()

    assert all(torch.equal(after[name], d[name]) for name in d)  # u = mu * 0 + d
    after["0.weight"].add_(1.0)
    assert torch.equal(replica.momentum_snapshot()["0.weight"], d["0.weight"])  # a copy


def test_outer_momentum_is_local_to_each_optimizer() -> None:
    a, b = OuterNesterov(lr=0.7, momentum=0.9), OuterNesterov(lr=0.7, momentum=0.9)
    m = {"w": torch.zeros(3)}

    a.step(m, {"w": torch.ones(3)})
    b.step(m, {"w": -torch.ones(3)})

    assert torch.equal(a.state_dict()["w"], torch.ones(3))
    assert torch.equal(b.state_dict()["w"], -torch.ones(3))


def test_outer_state_dict_round_trip_continues_identically() -> None:
    a = OuterNesterov(lr=0.7, momentum=0.9)
    a.step({"w": torch.zeros(2)}, {"w": torch.tensor([1.0, 2.0])})
    b = OuterNesterov(lr=0.7, momentum=0.9)
    b.load_state_dict(a.state_dict())

    step = ({"w": torch.ones(2)}, {"w": torch.tensor([0.5, -0.5])})
    assert torch.equal(a.step(*step)["w"], b.step(*step)["w"])


# --- replica state machine ---------------------------------------------------------------------


def run_round(replica: DilocoReplica, worker: int) -> None:
    replica.begin_round()
    for step in range(replica.config.inner_steps):
        replica.inner_step(*regression_batch(worker, replica.round, step), mse)
    x, d = replica.snapshot, replica.end_inner()
    replica.finish_round(x, d)


def test_replica_round_applies_outer_step_and_counts_rounds() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=3, inner_lr=1e-2))
    x = replica.begin_round()
    losses = [replica.inner_step(*regression_batch(0, 0, s), mse) for s in range(3)]
    d = replica.end_inner()

    replica.finish_round(x, d)

    after = replica.parameters_snapshot()
    # first outer step: u = d, x' = x - eta (1 + mu) d
    for name in x:
        torch.testing.assert_close(after[name], x[name] - 0.7 * (d[name] + 0.9 * d[name]))
    assert replica.round == 1 and replica.phase == "idle" and all(loss > 0 for loss in losses)


def test_replica_accepts_a_loss_callable() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    replica.begin_round()
    x, y = regression_batch(0, 0, 0)

    loss = replica.inner_step(lambda module: mse(module(x), y))

    with torch.no_grad():
        want = float(mse(make_mlp()(x), y))
    assert loss == pytest.approx(want)


def test_replica_refuses_out_of_order_calls() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    with pytest.raises(ProtocolError, match="inner_step"):
        replica.inner_step(*regression_batch(0, 0, 0), mse)
    with pytest.raises(ProtocolError, match="end_inner"):
        replica.end_inner()
    replica.begin_round()
    with pytest.raises(ProtocolError, match="begin_round"):
        replica.begin_round()
    with pytest.raises(ProtocolError, match="finish_round"):
        replica.finish_round({}, {})


def test_finish_round_needs_a_mixed_momentum_for_every_parameter() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    replica.begin_round()
    replica.inner_step(*regression_batch(0, 0, 0), mse)
    d = replica.end_inner()
    partial = {"0.weight": torch.zeros_like(d["0.weight"])}

    with pytest.raises(ProtocolError, match="u_mixed must cover every parameter"):
        replica.finish_round(replica.snapshot, d, partial)
    assert replica.phase == "outer"


def test_finish_round_needs_every_parameter() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    x = replica.begin_round()
    d = replica.end_inner()
    partial = {name: t for name, t in d.items() if name.startswith("0.")}

    with pytest.raises(ProtocolError, match="d_mixed"):
        replica.finish_round(x, partial)


def test_frozen_parameters_return_to_x_and_keep_their_momentum() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=2, inner_lr=1e-2))
    run_one_round(replica)
    momentum = replica.outer.state_dict()
    x = replica.begin_round()
    for step in range(2):
        replica.inner_step(*regression_batch(0, 1, step), mse)
    d = replica.end_inner()
    frozen = {name for name in d if name.startswith("2.")}
    stepped = {name: t for name, t in d.items() if name not in frozen}

    replica.finish_round({name: x[name] for name in stepped}, stepped, frozen=frozen)

    after, u = replica.parameters_snapshot(), replica.outer.state_dict()
    for name in d:
        if name in frozen:
            assert torch.equal(after[name], x[name]) and torch.equal(u[name], momentum[name])
        else:
            want = 0.9 * momentum[name] + d[name]
            torch.testing.assert_close(u[name], want)
            torch.testing.assert_close(after[name], x[name] - 0.7 * (d[name] + 0.9 * want))


def test_frozen_names_must_be_parameters_and_leave_the_rest_covered() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    x = replica.begin_round()
    d = replica.end_inner()

    with pytest.raises(ProtocolError, match="not parameters"):
        replica.finish_round(x, d, frozen={"nope"})
    with pytest.raises(ProtocolError, match="not frozen"):
        replica.finish_round(x, d, frozen={"2.bias"})


def run_one_round(replica: DilocoReplica, worker: int = 0) -> None:
    x = replica.begin_round()
    for step in range(replica.config.inner_steps):
        replica.inner_step(*regression_batch(worker, replica.round, step), mse)
    replica.finish_round(x, replica.end_inner())


def test_adopt_takes_the_swarm_state_and_restarts_both_optimizers() -> None:
    donor = DilocoReplica(make_mlp(seed=1), DilocoConfig(inner_steps=2))
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=2))
    for _ in range(3):
        run_one_round(donor, worker=1)
    run_one_round(replica)

    replica.adopt(donor.parameters_snapshot(), donor.round)

    assert replica.round == 3 and replica.phase == "idle"
    assert all(torch.equal(replica.parameters_snapshot()[n], t) for n, t in donor.parameters_snapshot().items())
    assert all(float(u.abs().sum()) == 0 for u in replica.outer.state_dict().values())
    assert not replica.inner_optimizer.state
    # a fresh replica adopting the same state continues exactly like this one
    fresh = DilocoReplica(make_mlp(seed=2), DilocoConfig(inner_steps=2))
    fresh.adopt(donor.parameters_snapshot(), donor.round)
    run_one_round(replica)
    run_one_round(fresh)
    assert all(torch.equal(replica.parameters_snapshot()[n], t) for n, t in fresh.parameters_snapshot().items())


@pytest.mark.parametrize("bad", ["missing", "shape", "round"])
def test_adopt_refuses_bad_state_without_touching_the_replica(bad: str) -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    before = replica.parameters_snapshot()
    params, round = DilocoReplica(make_mlp(seed=1)).parameters_snapshot(), 4
    if bad == "missing":
        params.pop("2.bias")
    elif bad == "shape":
        params["2.bias"] = torch.zeros(3)
    else:
        round = -1

    with pytest.raises(ProtocolError, match=r"adopt|shape"):
        replica.adopt(params, round)

    assert replica.round == 0 and all(torch.equal(before[n], t) for n, t in replica.parameters_snapshot().items())


def test_adopt_is_refused_during_a_round() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    x = replica.begin_round()
    with pytest.raises(ProtocolError, match="adopt"):
        replica.adopt(x, 1)


def test_non_finite_loss_raises_and_leaves_parameters_untouched() -> None:
    replica = DilocoReplica(make_mlp(), DilocoConfig(inner_steps=1))
    before = replica.parameters_snapshot()
    replica.begin_round()
    x, y = regression_batch(0, 0, 0)

    with pytest.raises(ProtocolError, match="non-finite"):
        replica.inner_step(x, y * float("nan"), mse)

    after = replica.parameters_snapshot()
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_replica_checkpoint_round_trip_continues_identically() -> None:
    cfg = DilocoConfig(inner_steps=3, inner_lr=1e-2)
    a = DilocoReplica(make_mlp(), cfg)
    run_round(a, worker=0)
    b = DilocoReplica(make_mlp(seed=9), cfg)
    b.load_state_dict(a.state_dict())

    run_round(a, worker=0)
    run_round(b, worker=0)

    pa, pb = a.parameters_snapshot(), b.parameters_snapshot()
    assert b.round == a.round == 2
    assert all(torch.equal(pa[n], pb[n]) for n in pa)


# --- bit-identity with plain DiLoCo ------------------------------------------------------------


def plain_diloco(init: nn.Module, n: int, rounds: int, cfg: DilocoConfig) -> dict[str, torch.Tensor]:
    """Textbook DiLoCo: one shared x; each worker runs H AdamW steps from x with its own optimizer
    state; Nesterov on the mean of the pseudo-gradients (sum in worker order, then / n)."""
    x = {name: p.detach().clone() for name, p in init.named_parameters()}
    workers = [make_mlp() for _ in range(n)]
    opts = [
        torch.optim.AdamW(w.parameters(), lr=cfg.inner_lr, betas=cfg.inner_betas, weight_decay=cfg.inner_weight_decay)
        for w in workers
    ]
    u = {name: torch.zeros_like(t) for name, t in x.items()}
    mu, eta = cfg.outer_momentum, cfg.outer_lr
    for t in range(rounds):
        ds = []
        for i, (worker, opt) in enumerate(zip(workers, opts, strict=True)):
            with torch.no_grad():
                for name, p in worker.named_parameters():
                    p.copy_(x[name])
            for step in range(cfg.inner_steps):
                xb, yb = regression_batch(i, t, step)
                opt.zero_grad(set_to_none=True)
                loss = mse(worker(xb), yb)
                loss.backward()
                nn.utils.clip_grad_norm_(list(worker.parameters()), cfg.grad_clip)
                opt.step()
            ds.append({name: x[name] - p.detach() for name, p in worker.named_parameters()})
        for name in x:
            total = ds[0][name].clone()
            for d in ds[1:]:
                total += d[name]
            d_mean = total / n
            u[name] = mu * u[name] + d_mean
            x[name] = x[name] - eta * (d_mean + mu * u[name])
    return x


def test_global_global_gossip_is_bit_identical_to_plain_diloco() -> None:
    n, rounds = 8, 3
    cfg = DilocoConfig(inner_steps=4, inner_lr=1e-2, grad_clip=0.5)
    replicas = [DilocoReplica(make_mlp(), cfg) for _ in range(n)]
    plan = MixingPlan(w1="global", w2="global")

    for t in range(rounds):
        simulate_round(replicas, regression_batch, plan, round=t, seed=0, loss_fn=mse)

    want = plain_diloco(make_mlp(), n, rounds, cfg)
    start = make_mlp().state_dict()
    for replica in replicas:
        got = replica.parameters_snapshot()
        assert all(torch.equal(got[name], want[name]) for name in want)
    assert not torch.equal(want["0.weight"], start["0.weight"])

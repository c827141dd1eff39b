"""FoMoE replicas through real rounds: bytes counted from the tensors moved equal the formula,
dense parts identical everywhere and experts identical among holders, experts a peer lacks or
nobody used keep their weights, re-placement keeps holders identical, and the model learns."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.core.errors import ProtocolError
from gossamer.protocols.core.models import evaluate, load_parameters
from gossamer.protocols.diloco.core.replica import DilocoConfig
from gossamer.protocols.fomoe.core import (
    FomoeConfig,
    FomoeReplica,
    MixedRound,
    Placement,
    build_moe_model,
    global_parameters,
    mix_round,
    place_experts,
    replace_experts,
    simulate_round,
    sync_bytes,
    transfers,
)
from tests.protocols.fomoe.core.conftest import TINY, tokens

PEERS = ["p0", "p1", "p2", "p3"]
DILOCO = DilocoConfig(inner_steps=3, inner_lr=3e-3, outer_lr=0.7, outer_momentum=0.9)


def swarm(placement: Placement, *, seed: int = 0) -> list[FomoeReplica]:
    return [FomoeReplica(peer, build_moe_model(TINY, seed=seed), placement.resident(peer), diloco=DILOCO)
            for peer in placement.peers]


def batch(index: int, round: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    window = tokens(4, 17, seed=10_000 * index + 100 * round + step)
    return window[:, :-1], window[:, 1:]


def params(replica: FomoeReplica) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in replica.module.named_parameters()}


@pytest.mark.parametrize("replication", [1, 2, 4])
def test_bytes_counted_from_the_real_tensors_equal_the_formula(replication: int) -> None:
    placement = place_experts(PEERS, n_experts=4, replication=replication, round=0)
    replicas = swarm(placement)

    report = simulate_round(replicas, placement, batch)

    expected = sync_bytes(replicas[0].layout, placement, idle=report.idle)
    assert (report.up_bytes, report.down_bytes, report.counts_bytes) == (
        expected.up_bytes, expected.down_bytes, expected.counts_bytes)
    if replication == 4:
        assert expected.up_bytes == 4 * replicas[0].layout.total_bytes


def test_skip_fraction_is_the_share_of_pairs_on_experts_a_peer_lacks() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=1, round=0)
    replicas = swarm(placement)

    report = simulate_round(replicas, placement, batch)

    assert len(report.steps) == len(replicas)
    for steps in report.steps:
        for step in steps:
            assert 0.0 < step.skip_fraction < 1.0
            assert step.routed_pairs == 4 * 16 * TINY.top_k * TINY.n_layers


def test_after_a_round_dense_is_identical_everywhere_and_each_expert_among_its_holders() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=2, round=0)
    replicas = swarm(placement)
    before = [params(r) for r in replicas]

    for _ in range(2):
        simulate_round(replicas, placement, batch)

    after = [params(r) for r in replicas]
    layout = replicas[0].layout
    for name in layout.dense:
        assert all(torch.equal(after[0][name], a[name]) for a in after[1:]), name
        assert not torch.equal(after[0][name], before[0][name]), name
    for (_, expert), names in layout.units.items():
        holders = [i for i, r in enumerate(replicas) if expert in r.resident]
        others = [i for i in range(4) if i not in holders]
        for name in names:
            assert all(torch.equal(after[holders[0]][name], after[i][name]) for i in holders), name
            assert all(torch.equal(before[i][name], after[i][name]) for i in others), name


def test_an_idle_expert_keeps_its_weights_and_gets_no_outer_momentum() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=4, round=0)
    replica = swarm(placement)[0]
    replica.begin_round()
    for step in range(3):
        replica.inner_step(*batch(0, 0, step))
    update = replica.end_inner()
    mixed = mix_round([update], placement, replica.layout, experts=range(4))
    idle_key = (1, 2)
    mixed = MixedRound(mixed.dense, {k: v for k, v in mixed.experts.items() if k != idle_key},
                       (idle_key,), mixed.dense_result, mixed.expert_results, ())
    x = replica.diloco.snapshot

    replica.finish_round(mixed)

    names = replica.layout.units[idle_key]
    now = params(replica)
    assert all(torch.equal(now[n], x[n]) for n in names)
    assert not any(n in replica.diloco.outer.state_dict() for n in names)
    moved = replica.layout.units[(0, 0)][0]
    assert not torch.equal(now[moved], x[moved])


def test_finish_round_refuses_a_mix_that_leaves_a_held_expert_out() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=1, round=0)
    replica = swarm(placement)[0]
    replica.begin_round()
    replica.inner_step(*batch(0, 0, 0))
    update = replica.end_inner()
    mixed = mix_round([update], placement, replica.layout, experts=[])

    with pytest.raises(ProtocolError, match="held units"):
        replica.finish_round(mixed)


def test_new_holders_adopt_experts_and_stay_identical_to_the_old_ones() -> None:
    before = place_experts(PEERS, n_experts=4, replication=2, round=0)
    replicas = swarm(before)
    simulate_round(replicas, before, batch)
    live = [r for r in replicas if r.sender != "p1"]
    after = replace_experts(before, [r.sender for r in live], round=1)
    by_peer = {r.sender: r for r in live}
    moves = transfers(before, after)
    assert moves and all(t.sources for t in moves)

    for replica in live:
        gained = {t.expert: by_peer[t.sources[0]].expert_state(t.expert) for t in moves if t.peer == replica.sender}
        replica.set_resident(after.resident(replica.sender), gained)
    for _ in range(2):
        simulate_round(live, after, batch)

    now = {r.sender: params(r) for r in live}
    for (_, expert), names in live[0].layout.units.items():
        holders = after.holders[expert]
        for name in names:
            assert all(torch.equal(now[holders[0]][name], now[h][name]) for h in holders), name


def test_set_resident_needs_the_state_of_every_new_expert() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=1, round=0)
    replica = swarm(placement)[0]
    new = next(e for e in range(4) if e not in replica.resident)

    with pytest.raises(ProtocolError, match="no state"):
        replica.set_resident({*replica.resident, new}, {})
    with pytest.raises(ProtocolError, match="does not hold"):
        replica.expert_state(new)


@pytest.mark.parametrize("renormalize", [False, True])
def test_a_partial_replica_swarm_learns(renormalize: bool) -> None:
    placement = place_experts(PEERS, n_experts=4, replication=1, round=0)
    replicas = [FomoeReplica(p, build_moe_model(TINY, seed=0), placement.resident(p), diloco=DILOCO,
                             fomoe=FomoeConfig(renormalize_skipped=renormalize)) for p in placement.peers]
    text = (b"the quick brown fox jumps over the lazy dog. " * 40)
    data = torch.tensor(list(text), dtype=torch.long)

    def text_batch(index: int, round: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1_000 * index + 10 * round + step)
        starts = torch.randint(0, data.numel() - 17, (8,), generator=gen)
        window = data[starts[:, None] + torch.arange(17)]
        return window[:, :-1], window[:, 1:]

    def heldout() -> float:
        model = build_moe_model(TINY, seed=0)
        load_parameters(model, global_parameters(replicas, placement))
        return evaluate(model, data.to(torch.uint8), context=16, batch_size=16, max_batches=2, device="cpu")

    start = heldout()
    for _ in range(6):
        simulate_round(replicas, placement, text_batch)

    assert heldout() < start - 1.0

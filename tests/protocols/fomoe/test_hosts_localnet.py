"""Expert hosts in one process (``gossamer_harness.localnet``): real HTTP between them, signed messages,
one view of signed records. Four hosts, four experts, r = 2: every round every update is used,
the dense part stays identical on every host and each expert identical on its holders, and the
update bytes are exactly the all-to-all formula; each writes its part at the end. A host whose update inbox fails for a round is
left out of that round by everyone and joins again (in a run without a last round, which could
end before it is back); a host that dies is re-placed with no expert
lost; when both holders of an expert die at once the two hosts left agree, restart it from the
freshest copy and flag it; a host that starts late (in a run without a last round, so that it
cannot arrive after the end) joins with the dense state from several donors and its experts from
their holders, and every member agrees on its digests."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from gossamer.protocols.fomoe.core import all_to_all_bytes
from gossamer.protocols.fomoe.host import ExpertHostRole
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.safetensors_stream import load_file
from gossamer_harness.localnet import LocalNet

pytestmark = pytest.mark.timeout(300)
RUN = {
    "run": {"name": "experts", "protocol": "fomoe", "heartbeat_s": 30.0},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32, "n_experts": 4, "top_k": 2},
    "hyper": {"rounds": 3, "batch_size": 8, "eval_batches": 2, "min_hosts": 4, "update_deadline_s": 60.0,
              "commit_deadline_s": 60.0, "diloco": {"inner_steps": 6, "inner_lr": 0.003},
              "fomoe": {"replication": 2}},
}


def run_with(**hyper) -> dict:
    return {**RUN, "hyper": {**RUN["hyper"], **hyper}}


async def hosts(tmp_path: Path, run: dict, count: int = 4) -> tuple[LocalNet, list[ExpertHostRole]]:
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=tmp_path)
    roles = [(await net.add(f"h{i}", ("expert-host",))).role for i in range(count)]
    return net, roles  # type: ignore[return-value]


async def drain(roles: list[ExpertHostRole]) -> None:
    await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles)), timeout=240)


def parameters(role: ExpertHostRole) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in role.replica.module.named_parameters()}


def assert_in_sync(roles: list[ExpertHostRole]) -> None:
    """Dense part identical on every host; each expert identical on all of its holders."""
    placement = roles[0].placement
    assert placement is not None
    layout = roles[0].replica.layout
    params = {role.peer_id: parameters(role) for role in roles}
    first = params[roles[0].peer_id]
    for role in roles[1:]:
        assert role.placement == placement
        assert all(torch.equal(first[n], params[role.peer_id][n]) for n in layout.dense), "dense parts differ"
    for (block, expert), unit in layout.units.items():
        holders = placement.holders[expert]
        assert holders, f"expert {expert} has no holder"
        for holder in holders[1:]:
            assert all(torch.equal(params[holders[0]][n], params[holder][n]) for n in unit), \
                f"holders of expert {expert} differ in block {block}"


def assert_balanced(role: ExpertHostRole) -> None:
    for ledger in role.history:
        for exchange in (ledger.updates, ledger.commits, ledger.transfers):
            assert exchange.balance_problems() == [], ledger.to_json()


async def test_four_hosts_use_every_update_stay_in_sync_and_move_the_all_to_all_bytes(tmp_path: Path) -> None:
    net, roles = await hosts(tmp_path, RUN)
    try:
        await net.start()
        await drain(roles)

        assert_in_sync(roles)
        placement = roles[0].placement
        assert placement is not None and placement.replications() == (2, 2, 2, 2)
        for role in roles:
            assert role.finished and role.round == 3 and len(role.history) == 3
            assert_balanced(role)
            for ledger in role.history:
                assert len(ledger.updates.used) == 3 and ledger.left == [] and ledger.note == ""
                assert ledger.skip_fraction > 0.0  # it holds 2 of 4 experts: pairs were skipped
            losses = [ledger.heldout_loss for ledger in role.history]
            assert losses[-1] < losses[0], losses
        sent = sum(role.history.get(0).update_bytes_sent for role in roles)  # type: ignore[union-attr]
        expected = all_to_all_bytes(roles[0].replica.layout, placement)
        assert sent == expected.up_bytes + expected.counts_bytes
        assert [sum(r.history.get(2).tokens) > 0 for r in roles] == [True] * 4  # type: ignore[union-attr]
        for role in roles:  # each wrote its part at the end: dense layers, routers and its experts
            tensors, metadata = load_file(role.checkpoint_path)
            assert metadata["round"] == "3" and metadata["experts"] == ",".join(map(str, sorted(role.replica.resident)))
            assert set(tensors) == set(role.replica.layout.names_held(role.replica.resident))
            assert "embed.weight" in tensors and torch.equal(tensors["embed.weight"], parameters(role)["embed.weight"])
    finally:
        await net.aclose()


async def test_a_host_whose_update_inbox_fails_is_left_out_by_everyone_and_joins_again(tmp_path: Path) -> None:
    # no last round: a run that ended before h3 came back would leave it nothing to rejoin
    net, roles = await hosts(tmp_path, run_with(rounds=0, update_deadline_s=6.0))  # h3 waits it out once
    net.fail("h3", 1, "update")  # h3 refuses every update sent to it in round 1
    try:
        await net.start()
        cut_off = roles[3]
        assert await net.peers["h0"].ctx.until_view(
            lambda: any(ledger.round > 1 for ledger in cut_off.history), timeout_s=240), "h3 trained again"
        again = next(ledger for ledger in cut_off.history if ledger.round > 1)
        assert again.round >= 2, "it joins again like a new peer, at the swarm's round"
        assert await net.peers["h0"].ctx.until_view(
            lambda: all(role.history.get(again.round) is not None for role in roles), timeout_s=120)

        h3 = cut_off.peer_id
        for role in roles[:3]:
            round1 = role.history.get(1)
            assert round1 is not None and h3 not in round1.agreed and round1.left == [h3], round1.to_json()
            assert h3 in round1.updates.rejected  # it arrived, but h3 did not hold the others'
        assert "cut off" in cut_off.history.get(1).note  # type: ignore[union-attr]
        everyone = sorted(role.peer_id for role in roles)
        for role in roles:  # agreed: the digests in every commit (dense part, each expert) matched
            theirs = role.history.get(again.round)
            assert theirs is not None and sorted(theirs.agreed) == everyone, theirs.to_json()
            assert_balanced(role)
    finally:
        await net.aclose()


async def test_a_dead_host_is_re_placed_and_no_expert_is_lost(tmp_path: Path) -> None:
    net, roles = await hosts(tmp_path, run_with(rounds=4))
    try:
        await net.start()
        survivors, dead = roles[:3], roles[3]
        assert await net.peers["h0"].ctx.until_view(lambda: dead.round >= 1, timeout_s=120)
        held = set(dead.replica.resident)
        await net.kill("h3")
        net.forget("h3")  # its record expired
        await net.publish()
        await drain(survivors)

        for role in survivors:
            assert role.finished and role.round == 4
            left = [ledger for ledger in role.history if ledger.left]
            assert [ledger.left for ledger in left] == [[dead.peer_id]]
            assert left[0].lost == [], "r = 2: every expert of the dead host had another holder"
            assert_balanced(role)
        placement = survivors[0].placement
        assert placement is not None and dead.peer_id not in placement.peers
        assert all(len(holders) == 2 for holders in placement.holders)
        assert held <= {e for role in survivors for e in role.replica.resident}
        assert_in_sync(survivors)
    finally:
        await net.aclose()


async def test_a_late_host_joins_with_the_dense_state_and_its_experts_from_their_holders(tmp_path: Path) -> None:
    net, roles = await hosts(tmp_path, run_with(rounds=0, min_hosts=3), count=3)  # no last round to race
    try:
        await net.start()
        assert await net.peers["h0"].ctx.until_view(lambda: roles[0].round >= 1, timeout_s=120)
        admitted: list[Mapping[str, Any]] = []
        net.watchers.append(lambda peer, event, fields: admitted.append(fields)
                            if (peer, event) == ("h3", "fomoe.joined") else None)
        downloading: list[tuple[int, int]] = []  # the joiner's (shards verified, shards), as it went
        net.watchers.append(lambda peer, event, fields: downloading.append((fields["shards_done"], fields["shards"]))
                            if (peer, event) == ("h3", "fomoe.downloading") else None)
        joiner: ExpertHostRole = (await net.add("h3", ("expert-host",))).role  # type: ignore[assignment]
        await net.start("h3")
        assert await net.peers["h0"].ctx.until_view(lambda: len(joiner.history) >= 2, timeout_s=240)
        assert len(admitted) == 1 and admitted[0]["donors"] >= 2, admitted  # the dense state from several hosts

        joined = list(joiner.history)[:2]
        assert joined[0].round >= 2, "the joiner starts at the swarm's round, not at 0"
        shards = downloading[-1][1]  # the last download (a first one may have failed as the round moved on)
        assert shards >= 1 and downloading[-shards - 1:] == [(k, shards) for k in range(shards + 1)], downloading
        assert joiner.replica.resident
        first_with_joiner = roles[0].history.get(joined[0].round - 1)
        assert first_with_joiner is not None and first_with_joiner.joiners == [joiner.peer_id]
        assert all(len(ledger.updates.used) == 3 for ledger in joined), [x.to_json() for x in joined]
        everyone = sorted([*(r.peer_id for r in roles), joiner.peer_id])
        for ledger in joined:  # agreed: the digests in every commit (dense part, each expert) matched
            assert sorted(ledger.agreed) == everyone
        rounds = [ledger.round for ledger in joined]  # the others may close those rounds a moment after the joiner
        assert await net.peers["h0"].ctx.until_view(
            lambda: all(role.history.get(r) is not None for role in roles for r in rounds), timeout_s=120)
        for role in roles:
            for ledger in joined:
                theirs = role.history.get(ledger.round)
                assert theirs is not None and sorted(theirs.agreed) == sorted(ledger.agreed), theirs.to_json()
        for role in [*roles, joiner]:
            assert_balanced(role)
    finally:
        await net.aclose()


async def test_both_holders_of_an_expert_dying_at_once_lose_it_and_the_two_left_go_on_in_sync(tmp_path: Path) -> None:
    # a kill that lands mid-round makes the two left wait out both deadlines once: 20 s each, not 60
    net, roles = await hosts(tmp_path, run_with(rounds=4, update_deadline_s=20.0, commit_deadline_s=20.0))
    try:
        await net.start()
        assert await net.peers["h0"].ctx.until_view(lambda: all(role.round >= 1 for role in roles), timeout_s=120)
        placement = roles[0].placement
        assert placement is not None
        doomed = set(placement.holders[0])
        dead = [(name, role) for name, role in zip(("h0", "h1", "h2", "h3"), roles, strict=True)
                if role.peer_id in doomed]
        survivors = [role for role in roles if role.peer_id not in doomed]
        for name, _role in dead:
            await net.kill(name)
            net.forget(name)
        await net.publish()
        await drain(survivors)

        for role in survivors:
            assert role.finished and role.round == 4
            left = [ledger for ledger in role.history if ledger.left]
            assert [sorted(ledger.left) for ledger in left] == [sorted(doomed)]
            assert 0 in left[0].lost, "expert 0 had no holder among the members left"
            row = role.status()["coverage"][0]
            assert row["holders"] and row["lost"], "it has holders again, flagged as restarted"
            assert_balanced(role)
        assert all(len(holders) == 2 for holders in survivors[0].placement.holders)
        assert_in_sync(survivors)
    finally:
        await net.aclose()

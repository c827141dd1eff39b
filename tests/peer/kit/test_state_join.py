"""State for joiners: through real daemons, three donors in one process (real hivemind DHT, real
HTTP) advertise their state in signed records and a joiner gets an exact, verified copy with one
shard from each; which version and digest a joiner trusts (a majority of the tenured donors, never
one donor's highest offer, issue 30) and the median that blends diverging replicas."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.kit.state_donor import StateDonor
from gossamer.peer.kit.state_join import (
    MAX_BLEND,
    NoQuorum,
    choose_donors,
    download_state,
    plan_state,
    weighted_median,
)
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.plugin import ProtocolPlugin
from gossamer.peer.role import Role
from gossamer.peer.run.manifest import RunConfig
from gossamer.peer.run.records import PRIVATE, PeerRecord
from gossamer.peer.run.view import LivePeer
from gossamer.peer.serving import donated_state, role_app
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer

pytestmark = pytest.mark.timeout(120)


def make_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(512, 256, generator=g), "head.bias": torch.randn(512, generator=g),
            "layer.0.weight": torch.randn(256, 256, generator=g).to(torch.bfloat16), "step": torch.tensor([7])}


class ReplicaRole(Role):
    """A role holding a replicated model at version 3 (what a DiLoCo learner will be)."""

    name = "replica"
    state = make_state()

    def model_state(self) -> tuple[int, Mapping[str, torch.Tensor]]:
        return 3, self.state


REGISTRY = PLUGINS.extended(ProtocolPlugin(name="replicas", summary="test: every peer holds one replica",
                                          roles=("replica",), load_roles=lambda: {"replica": ReplicaRole}))


def config(tmp_path: Path, name: str, **changes) -> PeerConfig:
    return PeerConfig(identity_path=tmp_path / f"{name}.pem", host="127.0.0.1", host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                      public_name=name, **changes)


async def wait_for_live(daemon: Daemon, count: int) -> None:
    for _ in range(200):
        await daemon.refresh_view()
        if len(daemon.view.live(now=daemon.membership.now())) >= count:
            return
        await daemon.publish_record()
    raise AssertionError(f"only {len(daemon.view.live(now=daemon.membership.now()))} live peers")


async def test_joiner_downloads_verified_state_from_three_donors(tmp_path: Path) -> None:
    owner = await Daemon.create(config(tmp_path, "owner", new_swarm=True, roles=("orchestrator", "replica")),
                                run_config=RunConfig(name="state", protocol="replicas", heartbeat_s=1.0), plugins=REGISTRY)
    daemons = [owner]
    try:
        join = {"run": owner.manifest.run_id, "initial_peers": tuple(owner.membership.visible_maddrs())}
        for i in range(2):
            daemons.append(await Daemon.create(config(tmp_path, f"donor{i}", roles=("replica",), **join),
                                               plugins=REGISTRY))
        joiner = await Daemon.create(config(tmp_path, "joiner", **join), plugins=REGISTRY)
        daemons.append(joiner)
        for daemon in daemons[:3]:
            await daemon.publish_record()
        await wait_for_live(joiner, 4)

        version, tensors, report = await download_state(joiner.http_client, joiner.view.live(now=joiner.membership.now()),
                                                        joiner_id=joiner.identity.peer_id)

        assert version == 3
        assert tensors.keys() == ReplicaRole.state.keys()
        assert all(torch.equal(tensors[k], ReplicaRole.state[k]) for k in tensors)
        assert sorted(len(shards) for shards in report.shards_served.values()) == [1, 1, 1]
        assert not report.failures
    finally:
        for daemon in reversed(daemons):
            await daemon.aclose()


def test_no_donor_is_a_clear_error() -> None:
    with pytest.raises(StateSyncError, match="no live peer offers"):
        choose_donors([])


T0 = 1_800_000_000.0


def offer(version: int, digest: str, *, since: float = T0, **changes) -> LivePeer:
    """A live learner advertising ``version`` at ``digest`` (a 64-hex string), live since ``since``."""
    identity = Identity.generate()
    record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="p", http_addr="127.0.0.1:9",
                        tcp_addr="", roles=("learner",), version="x", round=version, timestamp=T0,
                        state={"version": version, "digest": digest})
    return LivePeer(dataclasses.replace(record, **changes), last_seen=T0 + 600, since=since)


A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_one_tenured_donor_offering_a_newer_version_is_not_followed() -> None:
    """Issue 30 (3): the highest version on offer, one donor's word, used to win."""
    honest = [offer(5, A), offer(5, A)]
    liar = offer(6, B)  # tenured like the others: "current + 1", a noise state whose digest matches

    version, digest, donors = choose_donors([*honest, liar])

    assert (version, digest) == (5, A)
    assert sorted(d.peer_id for d in donors) == sorted(p.record.peer_id for p in honest)


def test_free_new_identities_do_not_count_towards_the_majority() -> None:
    honest = [offer(5, A), offer(5, A)]
    fresh = [offer(9, B, since=T0 + 590) for _ in range(10)]  # seen for 10 s of the default 60 s tenure

    plan = plan_state([*honest, *fresh])  # what FoMoE's and context's catch-up get: the default tenure

    assert (plan.version, plan.sources[0].digest, plan.offering) == (5, A, 2)
    vouched = plan_state([*honest, *fresh], tenure_s=60.0, vouched=[p.record.peer_id[:16] for p in fresh])
    assert vouched.version == 9  # the owner vouches for them: then they count (and are the majority)


def test_no_majority_version_is_no_quorum_and_names_the_offers() -> None:
    with pytest.raises(NoQuorum, match=r"majority \(2 of 2\).*version 6 \(bbbbbbbb\) by 1") as caught:
        plan_state([offer(5, A), offer(6, B)])
    assert (caught.value.offering, caught.value.quorum) == (2, 2)
    with pytest.raises(NoQuorum):
        plan_state([offer(5, A), offer(5, A), offer(6, B)], versions=range(6, 8))


def test_unreachable_or_malformed_offers_and_duplicates_do_not_count() -> None:
    one = offer(5, A)
    plan = plan_state([one, one, offer(6, B, reachability=PRIVATE), offer(7, "x" * 63), offer(True, A)])
    assert (plan.version, plan.offering, plan.quorum) == (5, 1, 1)


def test_a_majority_version_without_a_majority_digest_blends_at_most_max_blend() -> None:
    split = [offer(5, A), offer(5, B), offer(5, C), offer(4, A)]
    plan = plan_state(split)
    assert plan.version == 5 and plan.blended and {s.digest for s in plan.sources} == {A, B, C}
    many = [offer(5, f"{k:064x}") for k in range(MAX_BLEND + 3)]
    sampled = plan_state(many, rng=random.Random(0))
    assert len(sampled.sources) == MAX_BLEND and sampled.backing == MAX_BLEND // 2 + 1  # a majority of the sample
    assert plan.backing == plan.quorum == 3
    with pytest.raises(NoQuorum, match="no digest"):
        choose_donors(split)


def test_the_weighted_median_keeps_a_minority_inside_the_range_of_the_rest() -> None:
    g = torch.Generator().manual_seed(1)
    honest = [{"w": torch.randn(64, generator=g), "n": torch.tensor([3])} for _ in range(3)]
    noise = {"w": torch.full((64,), 1e6), "n": torch.tensor([10**9])}

    blended = weighted_median([*honest, noise, noise], [1, 1, 1, 1, 1])
    low = torch.stack([h["w"] for h in honest]).min(0).values
    high = torch.stack([h["w"] for h in honest]).max(0).values
    assert bool(((blended["w"] >= low) & (blended["w"] <= high)).all()) and int(blended["n"]) == 3
    same = weighted_median([honest[0], honest[0]], [2, 1])
    assert torch.equal(same["w"], honest[0]["w"])
    assert torch.equal(weighted_median([honest[0], noise], [2, 1])["w"], honest[0]["w"])  # 2 of 3 weight


async def test_diverging_replicas_at_the_majority_version_are_blended_by_their_median() -> None:
    """Gossip replicas of one round differ: each verified against its own digest, then the
    coordinate-wise median, so a liar among them moves no coordinate outside the honest range."""
    g = torch.Generator().manual_seed(2)
    states = [{"w": torch.randn(300, generator=g), "b": torch.randn(7, generator=g)} for _ in range(2)]
    states.append({"w": torch.full((300,), 1e6), "b": torch.full((7,), -1e6)})  # the liar's
    servers, live = [], []
    client = await HttpClient.create()
    try:
        for state in states:
            donor = StateDonor(lambda state=state: (4, state))
            server = await HttpServer.create(role_app([], donor), host="127.0.0.1", port=0, config=HttpConfig())
            servers.append(server)
            advertised = await donated_state(donor)
            live.append(offer(4, advertised["digest"], http_addr=f"127.0.0.1:{server.address[1]}"))

        version, tensors, report = await download_state(client, live, joiner_id="joiner")
    finally:
        await client.aclose()
        for server in servers:
            await server.aclose()

    assert version == 4 and report.sources == 3 and not report.failures
    for name in ("w", "b"):
        honest = torch.stack([states[0][name], states[1][name]])
        assert bool(((tensors[name] >= honest.min(0).values) & (tensors[name] <= honest.max(0).values)).all())

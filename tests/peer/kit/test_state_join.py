"""State for joiners through real daemons: three donors in one process (real hivemind DHT, real
HTTP) advertise their state in signed records; a joiner picks them from its live view and gets an
exact, verified copy with one shard from each donor."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.kit.state_join import choose_donors, download_state
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.plugin import ProtocolPlugin
from gossamer.peer.role import Role
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.registry import PLUGINS

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

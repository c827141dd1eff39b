"""Two real daemons (real DHT, real servers on 127.0.0.1): each dials the other back, calls itself
public in its signed record, ``/status`` and ``gossamer status``; a private peer is no state donor."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.peer.cli.status import format_table
from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.kit.state_join import choose_donors
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.run.manifest import RunConfig
from gossamer.peer.run.records import PRIVATE, PUBLIC, RELAYED, peer_row
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import tcp_connect
from tests.peer.run.test_records import make_record

pytestmark = pytest.mark.timeout(120)


def config(tmp_path: Path, name: str, **changes) -> PeerConfig:
    return PeerConfig(identity_path=tmp_path / f"{name}.pem", host="127.0.0.1", host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                      public_name=name, **changes)


async def test_daemons_dial_each_other_back_and_say_public(tmp_path: Path) -> None:
    owner = await Daemon.create(config(tmp_path, "owner", new_swarm=True, roles=("orchestrator",)),
                                run_config=RunConfig(name="reach", heartbeat_s=1.0), plugins=PLUGINS)
    daemons = [owner]
    try:
        join = {"run": owner.manifest.run_id, "initial_peers": tuple(owner.membership.visible_maddrs())}
        joiner = await Daemon.create(config(tmp_path, "joiner", **join), plugins=PLUGINS)
        daemons.append(joiner)
        for daemon in daemons:
            async with daemon._view_refreshed:  # the self-test runs once the other peer is in the view
                await daemon._view_refreshed.wait_for(lambda d=daemon: d.reach.reachability != "unknown")
            assert (daemon.reach.reachability, daemon.reach.selftest.verdict.answered) == (PUBLIC, 1)
            assert daemon.record().reachability == PUBLIC
            assert daemon.status()["reachability"]["kind"] == PUBLIC
        await joiner.publish_record()
        async with owner._view_refreshed:
            await owner._view_refreshed.wait_for(
                lambda: getattr(owner.view.get(joiner.identity.peer_id), "record", None) is not None
                and owner.view.get(joiner.identity.peer_id).record.reachability == PUBLIC)
        row = peer_row(owner.view.get(joiner.identity.peer_id).record, owner.membership.now())
        assert "public" in format_table([row])
    finally:
        for daemon in reversed(daemons):
            await daemon.aclose()


def test_a_private_peer_is_never_a_state_donor() -> None:
    state = {"version": 4, "digest": "ab" * 32}
    public, private = (make_record(Identity.generate(), state=state, reachability=kind) for kind in (PUBLIC, PRIVATE))
    live = [LivePeer(record=r, last_seen=0.0) for r in (public, private)]
    assert [d.peer_id for d in choose_donors(live)[2]] == [public.peer_id]
    with pytest.raises(StateSyncError):
        choose_donors(live[1:])


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_a_private_peer_is_reached_through_a_volunteer_relay(tmp_path: Path) -> None:
    """The joiner announces ports nothing listens on (as a NAT would leave them): it learns it is
    private, takes a relay from the owner (--relay) and announces the relay's ports; the owner's
    own HTTP and TCP clients reach the joiner through them."""
    owner = await Daemon.create(config(tmp_path, "owner", new_swarm=True, roles=("orchestrator",), relay=True),
                                run_config=RunConfig(name="relay", heartbeat_s=1.0), plugins=PLUGINS)
    daemons = [owner]
    try:
        join = {"run": owner.manifest.run_id, "initial_peers": tuple(owner.membership.visible_maddrs())}
        joiner = await Daemon.create(config(tmp_path, "joiner", announce_http_port=closed_port(),
                                            announce_tcp_port=closed_port(), **join), plugins=PLUGINS)
        daemons.append(joiner)
        me = joiner.identity.peer_id
        async with owner._view_refreshed:
            await owner._view_refreshed.wait_for(
                lambda: getattr(owner.view.get(me), "record", None) is not None
                and owner.view.get(me).record.reachability == RELAYED)
        assert joiner.reach.selftest.verdict.kind == PRIVATE
        assert "forward TCP port(s)" in joiner.status()["reachability"]["hint"]
        record = owner.view.get(me).record
        assert record.http_addr.split(":")[1] == str(joiner.reach.relaying.client.ports[0])
        assert await owner.http_client.get_json(f"http://{record.http_addr}/reach/whoami") == {"peer_id": me}
        host, port = record.tcp_addr.split(":")
        connection = await tcp_connect(host, int(port))
        answer = await connection.request(Frame(FrameType.REQUEST, {"method": "reach.whoami"}))
        await connection.aclose()
        assert answer.header["peer_id"] == me
        assert owner.status()["reachability"]["relaying_for"]["peers"] == 1
    finally:
        for daemon in reversed(daemons):
            await daemon.aclose()

"""Address hygiene: what a peer announces, what readers refuse, and the one-line warnings."""

from __future__ import annotations

import pytest

from gossamer.crypto.identity import Identity
from gossamer.peer.config import build_peer_config
from gossamer.peer.errors import ConfigError, RecordRejected, StartupError
from gossamer.peer.run.addresses import announced_host, dht_mismatch, route_source, unusable_address
from gossamer.peer.run.joining import fetch_manifest, lonely_line, start_membership
from gossamer.peer.run.records import open_record, seal_record
from tests.peer.run.test_records import NOW, TTL, make_record

PEER = "/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def config(**options):
    return build_peer_config(options)


def test_flags_win_and_loopback_swarms_get_loopback() -> None:
    assert announced_host(config(announce_host="10.0.0.5"), dht_maddrs=()) == "10.0.0.5"
    assert announced_host(config(host="127.0.0.1"), dht_maddrs=()) == "127.0.0.1"
    local_swarm = config(initial_peers=[f"/ip4/127.0.0.1/tcp/4000{PEER}"])
    assert announced_host(local_swarm, dht_maddrs=("/ip4/127.0.0.1/tcp/5",)) == "127.0.0.1"


def test_a_new_swarm_announces_a_routable_dht_address_not_loopback() -> None:
    maddrs = ("/ip4/127.0.0.1/tcp/5/p2p/x", "/ip6/fe80::1/tcp/5/p2p/x", "/ip6/2001:db8::1/tcp/5/p2p/x",
              "/ip4/192.0.2.7/tcp/5/p2p/x")
    assert announced_host(config(new_swarm=True), dht_maddrs=maddrs) == "192.0.2.7"
    assert announced_host(config(new_swarm=True), dht_maddrs=maddrs[:3]) == "2001:db8::1"


def test_a_remote_swarm_gets_the_interface_that_routes_to_it() -> None:
    remote = "192.0.2.1"
    source = route_source(remote)
    if not source:
        pytest.skip("this host has no route to a non-loopback address")
    joiner = config(initial_peers=[f"/ip4/{remote}/tcp/4000{PEER}"])
    assert announced_host(joiner, dht_maddrs=()) == source


@pytest.mark.parametrize("options", [{"announce_host": "127.0.0.1"}, {"host": "127.0.0.1"}])
def test_loopback_is_never_announced_to_a_remote_swarm(options) -> None:
    joiner = config(initial_peers=[f"/ip4/192.0.2.1/tcp/4000{PEER}"], **options)
    with pytest.raises(ConfigError, match="--announce_host"):
        announced_host(joiner, dht_maddrs=())


def test_the_unspecified_address_is_never_announced() -> None:
    with pytest.raises(ConfigError, match="--announce_host"):
        announced_host(config(announce_host="0.0.0.0"), dht_maddrs=())


@pytest.mark.parametrize("addr, problem", [
    ("", ""), ("10.0.0.1:80", ""), ("[::1]:80", ""), ("0.0.0.0:80", "unspecified"), ("10.0.0.1:0", "port 0"),
    ("nonsense", "not host:port")])
def test_unusable_addresses(addr: str, problem: str) -> None:
    assert (problem in unusable_address(addr)) and (bool(unusable_address(addr)) == bool(problem))


@pytest.mark.parametrize("field, addr", [("http_addr", "0.0.0.0:8000"), ("tcp_addr", "10.1.2.3:0")])
def test_readers_refuse_a_record_that_announces_an_undialable_address(field: str, addr: str) -> None:
    me = Identity.generate()
    blob = seal_record(me, make_record(me, **{field: addr}))
    with pytest.raises(RecordRejected) as caught:
        open_record(blob, subkey=me.peer_id, now=NOW, ttl_s=TTL)
    assert caught.value.reason == "address"


def test_dht_and_data_plane_disagreement_is_one_line() -> None:
    assert dht_mismatch("10.0.0.5", ("/ip4/10.0.0.5/tcp/1/p2p/x",)) == ""
    line = dht_mismatch("203.0.113.9", ("/ip4/10.0.0.5/tcp/1/p2p/x",))
    assert "10.0.0.5" in line and "203.0.113.9" in line and "--announce_host" in line and "\n" not in line


def test_lonely_lines_say_what_to_do() -> None:
    new = lonely_line(config(new_swarm=True, join_timeout_s=5.0), "gossamer peer --run r@x --initial_peers M")
    assert "--initial_peers M" in new and "second network" in new
    joined = lonely_line(config(initial_peers=[f"/ip4/127.0.0.1/tcp/4000{PEER}"]), "cmd")
    assert "records_rejected" in joined


async def test_a_joiner_on_a_new_swarm_is_told_it_started_its_own_network(tmp_path) -> None:
    joiner = config(run="demo@0123456789abcdef", new_swarm=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                    join_timeout_s=0.3, identity_path=str(tmp_path / "id.pem"))
    membership = await start_membership(joiner)
    try:
        with pytest.raises(StartupError, match="new, empty network"):
            await fetch_manifest(membership, joiner)
    finally:
        await membership.aclose()

"""DhtConfig refuses bad addresses and values, naming the field."""

from __future__ import annotations

import pytest

from gossamer.transport.dht.config import DhtConfig
from tests.transport.dht.support import MADE_UP_PEER_ID

PEER = f"/ip4/127.0.0.1/tcp/31337/p2p/{MADE_UP_PEER_ID}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_peers": ("/ip4/1.2.3.4/tcp",)},
         "initial_peers: '/ip4/1.2.3.4/tcp' is not a valid multiaddr; expected /ip4/HOST/tcp/PORT/p2p/PEERID"),
        ({"initial_peers": ("/ip4/1.2.3.4/tcp/5",)}, "initial_peers: '/ip4/1.2.3.4/tcp/5' lacks the /p2p/PEERID"),
        ({"initial_peers": PEER}, "initial_peers: must be a tuple"),
        ({"initial_peers": (PEER,), "host_maddrs": ("nonsense",)}, "host_maddrs: 'nonsense' is not a valid"),
        ({"initial_peers": (PEER,), "host_maddrs": ()}, "host_maddrs: give at least one"),
        ({"initial_peers": (PEER,), "announce_maddrs": ("/ip4/1.2.3.4/tcp/0",)}, "announce_maddrs: .* port 0"),
        ({}, "initial_peers: empty; pass --new_swarm to start a new network, or --initial_peers to join one"),
        ({"new_swarm": True, "initial_peers": (PEER,)}, "initial_peers: must be empty with new_swarm=True"),
        ({"new_swarm": True, "bootstrap_timeout_s": 0}, "bootstrap_timeout_s: must be a positive"),
        ({"new_swarm": True, "request_timeout_s": float("nan")}, "request_timeout_s: must be a positive"),
        ({"new_swarm": True, "max_value_bytes": -1}, "max_value_bytes: must be a positive"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        DhtConfig(**kwargs)


def test_valid_configs_are_accepted() -> None:
    assert DhtConfig(new_swarm=True).initial_peers == ()
    assert DhtConfig(initial_peers=(PEER,), announce_maddrs=("/ip4/1.2.3.4/tcp/31337",)).initial_peers == (PEER,)

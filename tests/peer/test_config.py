"""PeerConfig from flags and TOML: both spellings, precedence, and errors that name the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer.peer.cli.flags import peer_options
from gossamer.peer.cli.main import build_parser
from gossamer.peer.config import build_peer_config, load_toml_options
from gossamer.peer.errors import ConfigError


def parse_peer(argv: list[str]) -> dict:
    return peer_options(build_parser().parse_args(["peer", *argv]))


def test_underscore_and_kebab_flags_are_the_same() -> None:
    a = build_peer_config(None, parse_peer(["--initial_peers", "/ip4/1.2.3.4/tcp/5", "--http_port", "81"]))
    b = build_peer_config(None, parse_peer(["--initial-peers", "/ip4/1.2.3.4/tcp/5", "--http-port", "81"]))
    assert a == b and a.initial_peers == ("/ip4/1.2.3.4/tcp/5",) and a.http_port == 81


def test_announced_ports_are_flags() -> None:
    config = build_peer_config(None, parse_peer(["--announce-http-port", "8080", "--announce_tcp_port", "9090"]))
    assert (config.announce_http_port, config.announce_tcp_port, config.http_port) == (8080, 9090, 0)


def test_command_line_overrides_toml(tmp_path: Path) -> None:
    path = tmp_path / "peer.toml"
    path.write_text('public-name = "from-file"\njoin_timeout_s = 2.0\nroles = ["learner"]\n')
    config = build_peer_config(load_toml_options(path), parse_peer(["--public_name", "from-flag"]))
    assert config.public_name == "from-flag" and config.join_timeout_s == 2.0 and config.roles == ("learner",)


def test_roles_accept_commas() -> None:
    assert build_peer_config(None, parse_peer(["--roles", "learner,helper"])).roles == ("learner", "helper")


@pytest.mark.parametrize("options, field", [
    ({"http_port": 70000}, "http_port"),
    ({"announce_tcp_port": -1}, "announce_tcp_port"),
    ({"join_timeout_s": 0}, "join_timeout_s"),
    ({"device": "tpu"}, "device"),
    ({"host": "not-an-ip"}, "host"),
    ({"bogus": 1}, "unknown option"),
    ({"new_swarm": True, "initial_peers": ["/ip4/1.2.3.4/tcp/1"]}, "new_swarm"),
    ({"join_timeout_s": "fast"}, "join_timeout_s"),
])
def test_bad_options_name_the_field(options: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_peer_config(options, None)


def test_advertised_host_prefers_announce_then_bind_then_maddrs() -> None:
    assert build_peer_config({"announce_host": "10.0.0.5"}).advertised_host == "10.0.0.5"
    assert build_peer_config({"host": "127.0.0.2"}).advertised_host == "127.0.0.2"
    assert build_peer_config({"host_maddrs": ["/ip4/192.168.1.9/tcp/0"]}).advertised_host == "192.168.1.9"

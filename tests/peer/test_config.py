"""PeerConfig from flags and TOML: both spellings, precedence, and errors that name the option."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from gossamer.peer.cli.flags import add_peer_flags, peer_options
from gossamer.peer.cli.main import build_parser
from gossamer.peer.config import PeerConfig, build_peer_config, load_toml_options
from gossamer.peer.errors import ConfigError
from gossamer.protocols.core.settings import spec_of


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


def test_join_token_from_a_file_or_the_environment_and_the_flag_warns(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A token on the command line is visible in ``ps``: it still works, with a warning; a file or
    the environment give it without one (the flag first, then the file, then the variable)."""
    path = tmp_path / "token"
    path.write_text("from-file\n")
    args = build_parser().parse_args(["peer", "--join_token_file", str(path)])
    env = {"GOSSAMER_JOIN_TOKEN": "from-env", "GOSSAMER_STATUS_TOKEN": "status-from-env"}
    with caplog.at_level("WARNING"):
        from_file = build_peer_config(None, peer_options(args, environ=env))
        from_env = build_peer_config(None, peer_options(build_parser().parse_args(["peer"]), environ=env))
        assert not caplog.records
        from_flag = build_peer_config(None, peer_options(build_parser().parse_args(["peer", "--join-token", "flag"]),
                                                         environ=env))

    assert (from_file.join_token, from_env.join_token, from_flag.join_token) == ("from-file", "from-env", "flag")
    assert from_env.status_token == "status-from-env"
    assert [r.getMessage() for r in caplog.records] == [
        "--join_token on the command line is visible to every user of this host (ps, /proc); use --join_token_file "
        "or GOSSAMER_JOIN_TOKEN instead"]
    assert build_peer_config(None, peer_options(build_parser().parse_args(["peer"]), environ={})).join_token == ""


@pytest.mark.parametrize("argv", [["--join_token", "x", "--join_token_file", "{path}"],
                                  ["--join_token_file", "{missing}"]], ids=["both", "missing-file"])
def test_a_secret_flag_and_file_together_or_an_unreadable_file_is_a_config_error(tmp_path: Path,
                                                                                  argv: list[str]) -> None:
    (tmp_path / "token").write_text("t")
    argv = [a.format(path=tmp_path / "token", missing=tmp_path / "nope") for a in argv]
    with pytest.raises(ConfigError, match="join_token"):
        peer_options(build_parser().parse_args(["peer", *argv]), environ={})


def test_every_peer_flag_has_the_help_its_field_declares() -> None:
    """The help is written once, on the PeerConfig field; the flag shows it (and the default)."""
    parser = argparse.ArgumentParser()
    add_peer_flags(parser)
    helps = {action.dest: action.help for action in parser._actions}
    for field in fields(PeerConfig):
        doc = spec_of(field).doc
        assert doc and helps[field.name].startswith(doc), field.name
    assert helps["relay_max_peers"].endswith("(default 16)") and "(default" not in helps["http_port"]


def test_paths_given_as_strings_become_paths_and_bounds_are_config_errors() -> None:
    assert PeerConfig(identity_path="id.pem").identity_path == Path("id.pem")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="relay_max_peers must be >= 1"):
        PeerConfig(relay_max_peers=0)

"""The ``gossamer`` command: identity, peer, orchestrator, token, status, swarm, and the commands
each protocol's plugin brings (``serve`` and ``generate`` for BlockTrain, ``helper`` for TL++).

Errors the user can act on (bad flags, unreachable bootstrap peers, a port in use, a manifest
that does not verify) end as one ``error: ...`` line and exit code 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gossamer import __version__
from gossamer.crypto.errors import CryptoError
from gossamer.crypto.identity import PUBLIC_KEY_BYTES, Identity
from gossamer.crypto.tokens import issue_join_token
from gossamer.peer.cli.flags import add_peer_flags, peer_options
from gossamer.peer.cli.presets import presets
from gossamer.peer.config import DEFAULT_IDENTITY, PeerConfig, build_peer_config, load_toml_options
from gossamer.peer.errors import ConfigError, PeerError
from gossamer.peer.plugin import Command, PluginRegistry
from gossamer.peer.run.manifest import load_run_config, make_run_id
from gossamer.protocols.registry import PLUGINS


class CliKit:
    """The ``CommandKit`` plugins' commands use: the daemon's flags, config and runner."""

    def __init__(self, plugins: PluginRegistry) -> None:
        self.plugins = plugins

    def add_peer_flags(self, parser: argparse.ArgumentParser, *, skip: Sequence[str] = ()) -> None:
        parser.add_argument("-c", "--config", type=Path, help="TOML file with the same options as the flags")
        add_peer_flags(parser, skip=tuple(skip))

    def peer_config(self, args: argparse.Namespace, *, roles: Sequence[str]) -> PeerConfig:
        options = peer_options(args)
        options["roles"] = [*roles, *(r for r in options.get("roles") or [] if r not in roles)]
        return build_peer_config(load_toml_options(args.config) if args.config else {}, options)

    def run_daemon(self, config: PeerConfig, *, role_options: Mapping[str, Mapping[str, Any]] | None = None) -> int:
        from gossamer.peer.cli.service import run_daemon  # torch and hivemind load here, after parsing

        return run_daemon(config, plugins=self.plugins, role_options=role_options)


def build_parser(plugins: PluginRegistry = PLUGINS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gossamer", description="Decentralized peer-to-peer training network")
    parser.add_argument("--version", action="version", version=f"gossamer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    kit = CliKit(plugins)

    ident = sub.add_parser("identity", help="create or show this host's Ed25519 identity")
    ident.add_argument("action", choices=["new", "show"])
    ident.add_argument("--identity_path", "--identity-path", type=Path, default=None)

    peer = sub.add_parser("peer", help="start a peer daemon and join a run")
    peer.add_argument("-c", "--config", type=Path, help="TOML file with the same options as the flags")
    add_peer_flags(peer)

    orch = sub.add_parser("orchestrator", help="host a run: sign its manifest, publish it, bootstrap peers")
    orch.add_argument("-c", "--config", type=Path, required=True, help="run config TOML")
    add_peer_flags(orch, skip=("run", "manifest", "attack"))

    for _plugin, command in plugins.commands():
        command.add_arguments(sub.add_parser(command.name, help=command.help), kit)

    token = sub.add_parser("token", help="issue a join token for an allowlist run (owner only)")
    token.add_argument("-c", "--config", type=Path, required=True, help="the run config TOML")
    token.add_argument("--identity_path", "--identity-path", type=Path, default=None)
    token.add_argument("--expires_in_s", "--expires-in-s", type=float, default=7 * 24 * 3600.0)
    token.add_argument("--peer_public_key", "--peer-public-key", required=True,
                       help="the key the token admits (hex; `gossamer identity show` prints it): a token is published "
                            "in its peer's record, so one bound to no key would admit whoever read it")

    status = sub.add_parser("status", help="print the live peers of a run")
    status.add_argument("--run", required=True)
    status.add_argument("--initial_peers", "--initial-peers", nargs="+", required=True)
    status.add_argument("--timeout_s", "--timeout-s", type=float, default=15.0)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    swarm = sub.add_parser("swarm", help="launch an orchestrator and N peers on loopback",
                           epilog=f"presets: {', '.join(presets())}")
    where = swarm.add_mutually_exclusive_group(required=True)
    where.add_argument("-c", "--config", type=Path, help="run config TOML")
    where.add_argument("--preset", choices=presets(), metavar="NAME", help=f"a built-in preset: {', '.join(presets())}")
    swarm.add_argument("--peers", type=int, default=None, help="number of peers besides the orchestrator")
    swarm.add_argument("--duration_s", "--duration-s", type=float, default=None,
                       help="stop after this many seconds (default: the preset's, or run until Ctrl+C)")
    swarm.add_argument("--workdir", type=Path, default=None, help="where identities and logs go")
    return parser


def main(argv: list[str] | None = None, *, plugins: PluginRegistry = PLUGINS) -> int:
    args = build_parser(plugins).parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args, plugins)
    except (PeerError, CryptoError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace, plugins: PluginRegistry) -> int:
    """Run the parsed command. The heavy imports (torch, hivemind, aiohttp) happen here, after the
    arguments parsed, so ``--help`` and a wrong flag answer at once."""
    commands: dict[str, Command] = {command.name: command for _plugin, command in plugins.commands()}
    kit = CliKit(plugins)
    if args.command in commands:
        return commands[args.command].execute(args, kit)
    if args.command == "identity":
        return _identity(args)
    if args.command == "peer":
        file_options = load_toml_options(args.config) if args.config else {}
        return kit.run_daemon(build_peer_config(file_options, peer_options(args)))
    if args.command == "orchestrator":
        return _orchestrator(args, plugins)
    if args.command == "token":
        return _token(args)
    if args.command == "status":
        from gossamer.peer.cli.status import run_status

        return run_status(run=args.run, initial_peers=tuple(args.initial_peers), timeout_s=args.timeout_s,
                          as_json=args.json, plugins=plugins)
    from gossamer.peer.cli.swarm import SwarmOptions, run_swarm

    return run_swarm(SwarmOptions(config=args.config, preset=args.preset, peers=args.peers,
                                  duration_s=args.duration_s, workdir=args.workdir), plugins=plugins)


def _orchestrator(args: argparse.Namespace, plugins: PluginRegistry) -> int:
    """The run owner's daemon: ``orchestrator`` plus the roles its protocol gives the owner."""
    from gossamer.peer.cli.service import run_daemon

    run_config = load_run_config(args.config)
    plugin = plugins.plugin(run_config.protocol)
    options = peer_options(args)
    options["roles"] = ["orchestrator", *plugin.owner_roles, *(options.get("roles") or [])]
    return run_daemon(build_peer_config(run_config.peer, options), plugins=plugins, run_config=run_config)


def _identity(args: argparse.Namespace) -> int:
    path = (args.identity_path or DEFAULT_IDENTITY).expanduser()
    identity = Identity.create(path) if args.action == "new" else Identity.load(path)
    print(f"peer id:    {identity.peer_id}\npublic key: {identity.public_key.hex()}\nfile:       {path}")
    return 0


def _token(args: argparse.Namespace) -> int:
    owner = Identity.load((args.identity_path or DEFAULT_IDENTITY).expanduser())
    run_config = load_run_config(args.config)
    try:
        peer_key = bytes.fromhex(args.peer_public_key)
    except ValueError:
        peer_key = b""
    if len(peer_key) != PUBLIC_KEY_BYTES:
        raise ConfigError(f"--peer_public_key must be {2 * PUBLIC_KEY_BYTES} hex digits (the 'public key' line of "
                          f"`gossamer identity show` on the peer), got {args.peer_public_key[:80]!r}")
    token = issue_join_token(owner, run_id=make_run_id(run_config.name, owner.public_key),
                             expires_at=time.time() + args.expires_in_s, peer_public_key=peer_key,
                             nonce=secrets.token_bytes(16))
    print(token)
    return 0


if __name__ == "__main__":
    sys.exit(main())

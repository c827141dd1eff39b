"""The ``gossamer`` command: identity, peer, orchestrator, helper, serve, generate, token, status, swarm.

Errors the user can act on (bad flags, unreachable bootstrap peers, a port in use, a manifest
that does not verify) end as one ``error: ...`` line and exit code 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import time
from functools import partial
from pathlib import Path

from gossamer.crypto.errors import CryptoError
from gossamer.crypto.identity import Identity
from gossamer.crypto.tokens import issue_join_token
from gossamer.peer.cli.flags import add_peer_flags, peer_options
from gossamer.peer.cli.service import run_daemon
from gossamer.peer.cli.status import run_status
from gossamer.peer.cli.swarm import SwarmOptions, run_swarm
from gossamer.peer.config import DEFAULT_IDENTITY, build_peer_config, load_toml_options
from gossamer.peer.errors import PeerError
from gossamer.peer.roles import ROLE_FACTORIES
from gossamer.peer.roles.blocktrain.ar_stage import ArStageRole
from gossamer.peer.roles.blocktrain.commands import GenerateOptions, run_generate
from gossamer.peer.roles.blocktrain.server import BlockServerRole
from gossamer.peer.run.manifest import load_run_config, make_run_id


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gossamer", description="Decentralized peer-to-peer training network")
    sub = parser.add_subparsers(dest="command", required=True)

    ident = sub.add_parser("identity", help="create or show this host's Ed25519 identity")
    ident.add_argument("action", choices=["new", "show"])
    ident.add_argument("--identity_path", "--identity-path", type=Path, default=None)

    peer = sub.add_parser("peer", help="start a peer daemon and join a run")
    peer.add_argument("-c", "--config", type=Path, help="TOML file with the same options as the flags")
    add_peer_flags(peer)

    orch = sub.add_parser("orchestrator", help="host a run: sign its manifest, publish it, bootstrap peers")
    orch.add_argument("-c", "--config", type=Path, required=True, help="run config TOML")
    add_peer_flags(orch, skip=("run", "manifest"))

    helper = sub.add_parser("helper", help="host the second server of a TL++ secure-mode run (a peer with role helper)")
    helper.add_argument("-c", "--config", type=Path, help="TOML file with the same options as the flags")
    add_peer_flags(helper)

    serve = sub.add_parser("serve", help="serve blocks of a BlockTrain run over TCP (a block server)")
    serve.add_argument("-c", "--config", type=Path, help="TOML file with the same options as the flags")
    add_peer_flags(serve, skip=("roles",))
    serve.add_argument("--blocks", type=int, nargs="+", default=None, help="blocks to serve (default: all)")
    serve.add_argument("--ar_stages", "--ar-stages", type=int, nargs="+", default=None,
                       help="also serve these stages of the matched autoregressive pipeline (the baseline)")

    gen = sub.add_parser("generate", help="generate text through a BlockTrain run's block servers")
    gen.add_argument("prompt", help="text to continue")
    gen.add_argument("--run", required=True)
    gen.add_argument("--initial_peers", "--initial-peers", nargs="+", required=True)
    gen.add_argument("--new_bytes", "--new-bytes", type=int, default=64, help="bytes to generate")
    gen.add_argument("--traversals", type=int, default=4, help="refinement traversals per segment")
    gen.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    gen.add_argument("--seed", type=int, default=0, help="seed of the noise and of the sampling")
    gen.add_argument("--timeout_s", "--timeout-s", type=float, default=30.0)
    gen.add_argument("--baseline", choices=["ar"], default="", help="use the matched autoregressive pipeline")
    gen.add_argument("--device", default="cpu", help="where the client reads out the logits")
    gen.add_argument("--json", action="store_true", help="print a JSON summary instead of the text")

    token = sub.add_parser("token", help="issue a join token for an allowlist run (owner only)")
    token.add_argument("-c", "--config", type=Path, required=True, help="the run config TOML")
    token.add_argument("--identity_path", "--identity-path", type=Path, default=None)
    token.add_argument("--expires_in_s", "--expires-in-s", type=float, default=7 * 24 * 3600.0)
    token.add_argument("--peer_public_key", "--peer-public-key", default=None, help="bind the token to one key (hex)")

    status = sub.add_parser("status", help="print the live peers of a run")
    status.add_argument("--run", required=True)
    status.add_argument("--initial_peers", "--initial-peers", nargs="+", required=True)
    status.add_argument("--timeout_s", "--timeout-s", type=float, default=15.0)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    swarm = sub.add_parser("swarm", help="launch an orchestrator and N peers on loopback")
    where = swarm.add_mutually_exclusive_group(required=True)
    where.add_argument("-c", "--config", type=Path, help="run config TOML")
    where.add_argument("--preset", help="a built-in preset, e.g. demo")
    swarm.add_argument("--peers", type=int, default=None, help="number of peers besides the orchestrator")
    swarm.add_argument("--duration_s", "--duration-s", type=float, default=None,
                       help="stop after this many seconds (default: the preset's, or run until Ctrl+C)")
    swarm.add_argument("--workdir", type=Path, default=None, help="where identities and logs go")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args)
    except (PeerError, CryptoError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "identity":
        return _identity(args)
    if args.command == "peer":
        file_options = load_toml_options(args.config) if args.config else {}
        return run_daemon(build_peer_config(file_options, peer_options(args)))
    if args.command == "helper":
        options = peer_options(args)
        options["roles"] = ["helper", *(r for r in options.get("roles") or [] if r != "helper")]
        return run_daemon(build_peer_config(load_toml_options(args.config) if args.config else {}, options))
    if args.command == "orchestrator":
        run_config = load_run_config(args.config)
        options = peer_options(args)
        options["roles"] = ["orchestrator", *orchestrator_roles(run_config.protocol),
                            *(options.get("roles") or [])]
        return run_daemon(build_peer_config(run_config.peer, options), run_config=run_config)
    if args.command == "serve":
        return _serve_blocks(args)
    if args.command == "generate":
        return run_generate(GenerateOptions(
            run=args.run, initial_peers=tuple(args.initial_peers), prompt=args.prompt,
            new_bytes=args.new_bytes, traversals=args.traversals, temperature=args.temperature, seed=args.seed,
            timeout_s=args.timeout_s, baseline=args.baseline, device=args.device, as_json=args.json))
    if args.command == "token":
        return _token(args)
    if args.command == "status":
        return run_status(run=args.run, initial_peers=tuple(args.initial_peers), timeout_s=args.timeout_s,
                          as_json=args.json)
    return run_swarm(SwarmOptions(config=args.config, preset=args.preset, peers=args.peers,
                                  duration_s=args.duration_s, workdir=args.workdir))


def orchestrator_roles(protocol: str) -> list[str]:
    """Roles the orchestrator takes besides ``orchestrator`` for a run of ``protocol``."""
    return {"blocktrain": ["block-coordinator"], "tlpp": ["tlpp-server"]}.get(protocol, [])


def _serve_blocks(args: argparse.Namespace) -> int:
    """``gossamer serve``: a daemon with the block-server role (and ar-stage with --ar_stages)."""
    file_options = load_toml_options(args.config) if args.config else {}
    options = peer_options(args)
    options["roles"] = ["block-server", *(["ar-stage"] if args.ar_stages else [])]
    blocks = tuple(args.blocks) if args.blocks else None
    factories = {**ROLE_FACTORIES, "block-server": partial(BlockServerRole, blocks=blocks),
                 "ar-stage": partial(ArStageRole, stages=tuple(args.ar_stages or ()))}
    return run_daemon(build_peer_config(file_options, options), role_factories=factories)


def _identity(args: argparse.Namespace) -> int:
    path = (args.identity_path or DEFAULT_IDENTITY).expanduser()
    identity = Identity.create(path) if args.action == "new" else Identity.load(path)
    print(f"peer id:    {identity.peer_id}\npublic key: {identity.public_key.hex()}\nfile:       {path}")
    return 0


def _token(args: argparse.Namespace) -> int:
    owner = Identity.load((args.identity_path or DEFAULT_IDENTITY).expanduser())
    run_config = load_run_config(args.config)
    peer_key = bytes.fromhex(args.peer_public_key) if args.peer_public_key else None
    token = issue_join_token(owner, run_id=make_run_id(run_config.name, owner.public_key),
                             expires_at=time.time() + args.expires_in_s, peer_public_key=peer_key,
                             nonce=secrets.token_bytes(16))
    print(token)
    return 0


if __name__ == "__main__":
    sys.exit(main())

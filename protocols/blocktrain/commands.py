"""The BlockTrain commands: ``gossamer serve`` (a daemon serving blocks over TCP) and ``gossamer
generate`` (a client that routes a prompt through the run's block servers, ``generation``).

Only the parsers live here, so ``gossamer --help`` imports no torch; what each command runs is
named by reference and imported when it runs.
"""

from __future__ import annotations

import argparse

from gossamer.peer.errors import ConfigError
from gossamer.peer.plugin import Command, CommandKit
from gossamer.protocols.blocktrain import names


def _serve_arguments(parser: argparse.ArgumentParser, kit: CommandKit) -> None:
    kit.add_peer_flags(parser, skip=("roles", "attack", "data", "share_log"))
    parser.add_argument("--blocks", type=int, nargs="+", default=None, help="blocks to serve (default: all)")
    parser.add_argument("--ar_stages", "--ar-stages", type=int, nargs="+", default=None,
                        help="also serve these stages of the matched autoregressive pipeline (the baseline)")


def serve(args: argparse.Namespace, kit: CommandKit) -> int:
    """A daemon with the block-server role (and ar-stage with --ar_stages)."""
    roles = [names.SERVER, *([names.AR_STAGE] if args.ar_stages else [])]
    options = {names.SERVER: {"blocks": tuple(args.blocks) if args.blocks else None},
               names.AR_STAGE: {"stages": tuple(args.ar_stages or ())}}
    return kit.run_daemon(kit.peer_config(args, roles=roles), role_options=options)


def _generate_arguments(parser: argparse.ArgumentParser, kit: CommandKit) -> None:
    parser.add_argument("prompt_text", nargs="?", default=None, metavar="PROMPT",
                        help="text to continue (or --prompt); may follow --initial_peers")
    parser.add_argument("--prompt", default=None, help="text to continue")
    parser.add_argument("--run", required=True)
    parser.add_argument("--initial_peers", "--initial-peers", nargs="+", required=True,
                        help="multiaddrs of running peers (/ip4/.../tcp/.../p2p/...)")
    parser.add_argument("--new_bytes", "--new-bytes", type=int, default=64, help="bytes to generate")
    parser.add_argument("--passes", "--traversals", dest="passes", type=int, default=4,
                        help="refinement passes through the block stack per segment")
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise and of the sampling")
    parser.add_argument("--timeout_s", "--timeout-s", type=float, default=30.0)
    parser.add_argument("--baseline", choices=["ar"], default="", help="use the matched autoregressive pipeline")
    parser.add_argument("--device", default="cpu", help="where the client reads out the logits")
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead of the text")


def prompt_and_peers(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """The prompt and the multiaddrs. ``--initial_peers`` takes one or more values, so a prompt
    written after it (``--initial_peers /ip4/... "The "``) lands in that list: a multiaddr always
    starts with ``/``, so trailing values that do not are the prompt, not peers."""
    peers = list(args.initial_peers)
    trailing = []
    while peers and not peers[-1].startswith("/"):
        trailing.insert(0, peers.pop())
    given = [text for text in (args.prompt, args.prompt_text, *trailing) if text is not None]
    if len(given) != 1:
        raise ConfigError("gossamer generate takes one prompt (as the last argument or with --prompt), "
                          f"got {len(given)}: {given!r}")
    if not peers:
        raise ConfigError("--initial_peers needs at least one multiaddr (/ip4/HOST/tcp/PORT/p2p/...)")
    return given[0], tuple(peers)


def generate(args: argparse.Namespace, kit: CommandKit) -> int:
    from gossamer.protocols.blocktrain.generation import GenerateOptions, run_generate

    prompt, initial_peers = prompt_and_peers(args)
    return run_generate(GenerateOptions(
        run=args.run, initial_peers=initial_peers, prompt=prompt, new_bytes=args.new_bytes,
        passes=args.passes, temperature=args.temperature, seed=args.seed, timeout_s=args.timeout_s,
        baseline=args.baseline, device=args.device, as_json=args.json))


SERVE = Command(name="serve", help="serve blocks of a BlockTrain run over TCP (a block server)",
                add_arguments=_serve_arguments, run=serve)
GENERATE = Command(name="generate", help="generate text through a BlockTrain run's block servers",
                   add_arguments=_generate_arguments, run=generate)

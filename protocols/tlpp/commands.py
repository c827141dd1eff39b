"""The TL++ commands: ``gossamer helper``, a daemon with the helper role (secure mode's second
party), and ``gossamer node --helper PEER_ID``, a data node that trusts that helper only."""

from __future__ import annotations

import argparse

from gossamer.peer.plugin import Command, CommandKit
from gossamer.protocols.tlpp import names


def _helper_arguments(parser: argparse.ArgumentParser, kit: CommandKit) -> None:
    kit.add_peer_flags(parser, skip=("roles", "attack", "data"))


def _helper(args: argparse.Namespace, kit: CommandKit) -> int:
    return kit.run_daemon(kit.peer_config(args, roles=[names.HELPER]))


def _node_arguments(parser: argparse.ArgumentParser, kit: CommandKit) -> None:
    kit.add_peer_flags(parser, skip=("roles", "attack"))
    parser.add_argument("--helper", required=True, metavar="PEER_ID",
                        help="the peer id of the helper you trust (its operator prints it with `gossamer identity "
                             "show`); the node joins only a secure run whose manifest names it, and shares only with it")


def _node(args: argparse.Namespace, kit: CommandKit) -> int:
    return kit.run_daemon(kit.peer_config(args, roles=[names.NODE]), role_options={names.NODE: {"helper": args.helper}})


HELPER = Command(name="helper", help="host the second party of a TL++ secure-mode run (a peer with role helper)",
                 add_arguments=_helper_arguments, run=_helper)
NODE = Command(name="node", help="a TL++ data node of a secure-mode run, pinned to the helper its owner trusts",
               add_arguments=_node_arguments, run=_node)

"""The TL++ command: ``gossamer helper``, a daemon with the helper role (secure mode's second server)."""

from __future__ import annotations

import argparse

from gossamer.peer.plugin import Command, CommandKit
from gossamer.peer.roles.tlpp import names


def _helper_arguments(parser: argparse.ArgumentParser, kit: CommandKit) -> None:
    kit.add_peer_flags(parser, skip=("roles", "attack", "data"))


def _helper(args: argparse.Namespace, kit: CommandKit) -> int:
    return kit.run_daemon(kit.peer_config(args, roles=[names.HELPER]))


HELPER = Command(name="helper", help="host the second server of a TL++ secure-mode run (a peer with role helper)",
                 add_arguments=_helper_arguments, run=_helper)

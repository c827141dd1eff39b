"""``gossamer generate`` reads its prompt wherever the README puts it: after ``--initial_peers``
(which takes one or more values), as the last argument, or with ``--prompt``."""

from __future__ import annotations

import pytest

from gossamer.peer.cli.main import build_parser
from gossamer.peer.errors import ConfigError
from gossamer.protocols.blocktrain.commands import prompt_and_peers

PEER = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWExample"


@pytest.mark.parametrize("argv", [
    ["generate", "--run", "r@0123456789abcdef", "--initial_peers", PEER, "The "],  # the README's order
    ["generate", "The ", "--run", "r@0123456789abcdef", "--initial_peers", PEER],
    ["generate", "--run", "r@0123456789abcdef", "--initial_peers", PEER, "--prompt", "The "],
])
def test_the_prompt_is_found_wherever_it_is_written(argv: list[str]) -> None:
    assert prompt_and_peers(build_parser().parse_args(argv)) == ("The ", (PEER,))


def test_two_prompts_or_no_peer_are_refused_with_one_line() -> None:
    both = build_parser().parse_args(["generate", "--run", "r@0", "--initial_peers", PEER, "a", "--prompt", "b"])
    with pytest.raises(ConfigError, match="one prompt"):
        prompt_and_peers(both)
    with pytest.raises(ConfigError, match="at least one multiaddr"):
        prompt_and_peers(build_parser().parse_args(["generate", "--run", "r@0", "--initial_peers", "The "]))

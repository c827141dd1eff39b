"""The DiLoCo command: ``gossamer sample``, which continues a prompt with a learner's checkpoint on
this host (no network): the final checkpoint a learner writes when ``rounds`` is reached, or the
state it writes on Ctrl+C and every ``checkpoint_every`` rounds. The parser lives here so that
``gossamer --help`` imports no torch; what runs is in ``sampling``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gossamer.peer.plugin import Command, CommandKit


def _sample_arguments(parser: argparse.ArgumentParser, kit: CommandKit) -> None:
    parser.add_argument("prompt_text", nargs="?", default=None, metavar="PROMPT", help="text to continue")
    parser.add_argument("--prompt", default=None, help="text to continue (instead of the positional PROMPT)")
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="a learner's checkpoint (.safetensors in its --checkpoint_dir)")
    parser.add_argument("--new_bytes", "--new-bytes", type=int, default=200, help="bytes to generate")
    parser.add_argument("--temperature", type=float, default=0.7, help="0: greedy")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")


def _sample(args: argparse.Namespace, kit: CommandKit) -> int:
    from gossamer.protocols.diloco.sampling import run_sample

    return run_sample(args)


SAMPLE = Command(name="sample", help="continue a prompt with a DiLoCo learner's checkpoint, locally",
                 add_arguments=_sample_arguments, run=_sample)

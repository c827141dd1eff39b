"""``gossamer sample``: load a learner's checkpoint (its parameters and the model config written
beside them) and continue a prompt on this host."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from gossamer.peer.device import resolve_device
from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.state_tree import unpack_state
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig, build_model, generate, load_parameters
from gossamer.transport.errors import DecodeError
from gossamer.transport.safetensors_stream import load_file

FORMATS = ("gossamer/diloco", "gossamer/diloco-state")


def load_checkpoint(path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, str]]:
    """(model config, parameters, metadata) of a learner's checkpoint; ConfigError saying why not."""
    try:
        tensors, metadata = load_file(path, require_finite=True)
    except OSError as exc:
        raise ConfigError(f"cannot read --checkpoint {path}: {exc.strerror or exc}") from exc
    except DecodeError as exc:
        raise ConfigError(f"--checkpoint {path} is not a valid safetensors file: {exc}") from exc
    if metadata.get("format") not in FORMATS or "model" not in metadata:
        raise ConfigError(f"--checkpoint {path} is not a DiLoCo learner's checkpoint with its model config "
                          f"(format {metadata.get('format')!r})")
    try:
        config = ModelConfig.from_dict(json.loads(metadata["model"]))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--checkpoint {path}: its model config is not valid: {exc}") from exc
    if metadata["format"].endswith("-state"):
        tensors = unpack_state(tensors)["module"]
    return config, tensors, metadata


def run_sample(args: argparse.Namespace) -> int:
    given = [text for text in (args.prompt, args.prompt_text) if text is not None]
    if len(given) != 1:
        raise ConfigError("gossamer sample takes one prompt (as the last argument or with --prompt)")
    config, params, metadata = load_checkpoint(args.checkpoint)
    device = resolve_device(args.device)
    model = build_model(config, seed=0, device=device)
    try:
        load_parameters(model, {name: params[name] for name in params if not name.startswith("_")})
        text = generate(model, given[0].encode("utf-8"), max_new_bytes=args.new_bytes, temperature=args.temperature,
                        generator=torch.Generator(device=device).manual_seed(args.seed))
    except InvalidSetting as exc:
        raise ConfigError(f"--checkpoint {args.checkpoint}: {exc}") from exc
    sys.stdout.write(given[0] + text.decode("utf-8", "replace") + "\n")
    print(f"[{args.new_bytes} bytes from {args.checkpoint}, run {metadata.get('run_id')}, round {metadata.get('round')}]",
          file=sys.stderr)
    return 0

"""A role's resumable state (an optimizer's ``state_dict()``, generators, counters) as one checkpoint
file: tensors under their path in the tree, everything else in one JSON layout, rebuilt exactly;
``write_state`` and ``resume_state`` are what a role calls (README.md of peer, "kit.state_tree")."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.checkpoint import Checkpoints

log = logging.getLogger(__name__)
LAYOUT = "__layout__"


def snapshot(tree: Any) -> Any:
    """The same tree with every tensor copied to the CPU (detached; shares nothing with ``tree``)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, Mapping):
        return {key: snapshot(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(snapshot(value) for value in tree)
    return tree


def pack_state(tree: Any) -> dict[str, torch.Tensor]:
    """Named tensors holding ``tree`` (its tensors, plus the layout under ``__layout__``)."""
    tensors: dict[str, torch.Tensor] = {}
    layout = _encode(tree, "", tensors)
    tensors[LAYOUT] = torch.frombuffer(bytearray(json.dumps(layout).encode("utf-8")), dtype=torch.uint8)
    return tensors


def unpack_state(tensors: Mapping[str, torch.Tensor]) -> Any:
    """The tree ``pack_state`` packed; ConfigError when the tensors are not such a tree."""
    if LAYOUT not in tensors:
        raise ConfigError("this checkpoint holds no resumable state (no layout)")
    try:
        layout = json.loads(bytes(tensors[LAYOUT].to(torch.uint8).tolist()).decode("utf-8"))
        return _decode(layout, tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"this checkpoint's state layout is damaged: {exc}") from exc


def _encode(tree: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, torch.Tensor):
        tensors[path] = tree.detach().to("cpu").contiguous().clone()
        return {"$t": path}
    if isinstance(tree, Mapping):
        return {"$d": [[key, _encode(value, f"{path}/{key}" if path else str(key), tensors)]
                       for key, value in tree.items()]}
    if isinstance(tree, list | tuple):
        items = [_encode(value, f"{path}/{i}" if path else str(i), tensors) for i, value in enumerate(tree)]
        return {"$u" if isinstance(tree, tuple) else "$l": items}
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    raise TypeError(f"state at {path or 'the root'} is a {type(tree).__name__}, not a tensor or plain value")


def _decode(layout: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(layout, dict):
        if "$t" in layout:
            return tensors[layout["$t"]].clone()
        if "$d" in layout:
            return {key: _decode(value, tensors) for key, value in layout["$d"]}
        if "$l" in layout:
            return [_decode(value, tensors) for value in layout["$l"]]
        if "$u" in layout:
            return tuple(_decode(value, tensors) for value in layout["$u"])
        raise ValueError(f"unknown layout entry {sorted(layout)}")
    return layout


KIND = "state"  # the checkpoint kind of a role's resumable state


async def write_state(files: Checkpoints, name: str, tree: Any, **metadata: str) -> str:
    """Write ``tree`` as ``<name>.safetensors`` (kind ``state``); its path."""
    return str(await files.write_async(name, pack_state(tree), kind=KIND, **metadata))


def resume_state(files: Checkpoints, name: str, apply: Callable[[Any], None]) -> str:
    """Hand the state an earlier life wrote under ``name`` to ``apply`` (which loads it into the
    role); its path, or "" when there is none or it does not fit (said in a warning: the role
    then starts afresh rather than from half a state)."""
    found = files.read(name, kind=KIND)
    if found is None:
        return ""
    path = str(files.path(name))
    try:
        apply(unpack_state(found[0]))
    except (ConfigError, KeyError, IndexError, RuntimeError, ValueError, TypeError) as exc:
        log.warning("not resuming from %s: %s", path, exc)
        return ""
    return path

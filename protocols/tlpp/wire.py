"""What the TL++ roles say to each other over ``peer.kit.secure_link`` (methods, ops, their
names) and the checks on what arrives. Every share carries its ``party`` (the orchestrator takes
only party 0, the helper only party 1); a node's gradients travel as one flat int64 vector. The
table of messages is in ``protocols/tlpp/README.md``, "Messages on the wire"."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from gossamer.peer.kit.secure_link import LinkMessage, RequestRefused

NODE_METHOD = "tlpp-node"
HELPER_METHOD = "tlpp-helper"
FORWARD, BACKWARD = "forward", "backward"
SHARE, LOGITS, SUM, PING = "share", "logits", "sum", "ping"
ACT = "act"
GRADS = "grads"
MAX_INDICES = 1 << 16
SHARE_WINDOW = 2  # the helper takes shares of steps announced .. announced + SHARE_WINDOW (announced: the
# orchestrator's latest step; it announces one with a ``ping`` when it would otherwise fall behind)


class ShareLog:
    """Appends one JSON line per received share to ``path`` (nothing when ``path`` is None)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path).expanduser() if path else None

    def record(self, *, step: int, node: str, tensors: list[str], share_index: int) -> None:
        if self.path is None:
            return
        lines = "".join(json.dumps({"step": step, "node": node, "tensor": name, "share_index": share_index},
                                   sort_keys=True) + "\n" for name in tensors)
        with self.path.open("a", encoding="utf-8") as log:
            log.write(lines)


def check_tensors(received: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], *, what: str,
                  dtype: torch.dtype | None = None) -> None:
    """RequestRefused unless ``received`` has exactly ``expected``'s names and shapes, and
    ``dtype`` (or, when None, each expected tensor's dtype)."""
    if set(received) != set(expected):
        missing, extra = sorted(set(expected) - set(received)), sorted(set(received) - set(expected))
        raise RequestRefused(f"{what}: tensor names do not match (missing {missing[:5]}, unexpected {extra[:5]})",
                             code="malformed")
    for name, tensor in received.items():
        want = dtype or expected[name].dtype
        if tensor.shape != expected[name].shape or tensor.dtype != want:
            raise RequestRefused(f"{what}: {name!r} is {tuple(tensor.shape)} {tensor.dtype}, expected "
                                 f"{tuple(expected[name].shape)} {want}", code="malformed")


def flat_grads(numel: int) -> dict[str, torch.Tensor]:
    """What a message of flat gradient shares must hold (for ``check_tensors``): ``grads``, int64 [numel]."""
    return {GRADS: torch.empty(numel, dtype=torch.int64)}


def check_party(fields: Mapping[str, object], party: int, *, what: str) -> None:
    """RequestRefused unless the message says it carries shares of ``party``."""
    if fields.get("party") != party:
        raise RequestRefused(f"{what}: carries shares of party {fields.get('party')!r}; this party takes only "
                             f"party {party}'s", code="party")


def check_indices(indices: object, count: int) -> list[int]:
    """The local sample indices of a forward request; RequestRefused when any is out of range."""
    if not isinstance(indices, list) or not 0 < len(indices) <= MAX_INDICES:
        raise RequestRefused(f"indices: need a list of 1..{MAX_INDICES} sample indices", code="malformed")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in indices):
        raise RequestRefused(f"indices: every index must be an integer in [0, {count})", code="malformed")
    return indices


def node_list(value: object, what: str) -> list[str]:
    """A request's list of node ids (sorted, unique); RequestRefused otherwise."""
    if not isinstance(value, list) or not value or not all(isinstance(n, str) and n for n in value):
        raise RequestRefused(f"{what}: need a non-empty list of node ids", code="malformed")
    if len(set(value)) != len(value):
        raise RequestRefused(f"{what}: node ids repeat", code="malformed")
    return sorted(value)


def used_nodes(reply: LinkMessage, asked: Mapping[str, object]) -> list[str]:
    """The nodes the helper's answer says it used, of those it was asked about (sorted)."""
    nodes = reply.fields.get("nodes")
    return sorted(n for n in nodes if isinstance(n, str) and n in asked) if isinstance(nodes, list) else []

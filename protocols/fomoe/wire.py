"""What expert hosts send each other: signed safetensors bodies PUT to ``/fomoe/{kind}/{round}``
(``update``, ``commit``, ``join``, ``expert``; the table is in ``README.md``), and their checks
against the model (names, dtypes, shapes, finite values, counts) before anything is stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import torch

from gossamer.protocols.fomoe.core import ExpertState, FomoeUpdate, ParamLayout, expert_of
from gossamer.protocols.fomoe.core.errors import ExpertMessageRefused
from gossamer.transport.codec import tensor_bytes

UPDATE, COMMIT, JOIN, EXPERT = "update", "commit", "join", "expert"
KINDS = (UPDATE, COMMIT, JOIN, EXPERT)
TOKENS = "tokens"
PARAM, MOMENTUM = "param/", "momentum/"

Tensors = dict[str, torch.Tensor]


class ModelShape:
    """Names, shapes and dtypes of the run's model: what every tensor of a message is checked against."""

    def __init__(self, layout: ParamLayout, dtypes: Mapping[str, torch.dtype]) -> None:
        self.layout = layout
        self.dtypes = dict(dtypes)

    def check(self, name: str, tensor: torch.Tensor, what: str) -> None:
        if name not in self.dtypes:
            raise ExpertMessageRefused(f"{what}: unknown parameter {name[:80]!r}")
        if tensor.dtype != self.dtypes[name] or tuple(tensor.shape) != self.layout.shapes[name]:
            raise ExpertMessageRefused(f"{what}: {name} is {tensor.dtype} {tuple(tensor.shape)}, "
                                       f"expected {self.dtypes[name]} {self.layout.shapes[name]}")
        if not bool(torch.isfinite(tensor).all()):
            raise ExpertMessageRefused(f"{what}: {name} is not finite")

    @property
    def max_message_bytes(self) -> int:
        """The largest body any message may have: two copies of every parameter (an expert
        state carries parameters and momentum), the counts, and room for the header."""
        return 2 * self.layout.total_bytes + 8 * self.layout.n_layers * self.layout.n_experts + (1 << 20)


def update_payload(update: FomoeUpdate) -> Tensors:
    """The tensors of an ``update`` message (on the CPU)."""
    return {**{name: t.detach().cpu() for name, t in update.delta.items()}, TOKENS: update.tokens.cpu()}


def read_update(sender: str, tensors: Mapping[str, torch.Tensor], shape: ModelShape) -> FomoeUpdate:
    """An update message as a ``FomoeUpdate``; ``ExpertMessageRefused`` if it does not fit the model."""
    tokens = tensors.get(TOKENS)
    layout = shape.layout
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int64 or \
            tuple(tokens.shape) != (layout.n_layers, layout.n_experts):
        raise ExpertMessageRefused(f"update: {TOKENS} must be int64 [{layout.n_layers}, {layout.n_experts}]")
    if bool((tokens < 0).any()):
        raise ExpertMessageRefused(f"update: negative {TOKENS}")
    delta = {name: t for name, t in tensors.items() if name != TOKENS}
    for name, tensor in delta.items():
        shape.check(name, tensor, "update")
    return FomoeUpdate(sender, delta, tokens)


def experts_payload(states: Sequence[ExpertState]) -> Tensors:
    """The tensors of an ``expert`` message carrying ``states``."""
    out: Tensors = {}
    for state in states:
        out.update({PARAM + name: t.detach().cpu() for name, t in state.params.items()})
        out.update({MOMENTUM + name: t.detach().cpu() for name, t in state.momentum.items()})
    return out


def read_experts(tensors: Mapping[str, torch.Tensor], shape: ModelShape) -> dict[int, ExpertState]:
    """An expert message as one ``ExpertState`` per expert it carries; each must be whole (every
    parameter of the expert in every block; momentum for a subset, or none)."""
    params: dict[int, Tensors] = {}
    momentum: dict[int, Tensors] = {}
    for key, tensor in tensors.items():
        kind, name = (PARAM, key[len(PARAM):]) if key.startswith(PARAM) else (MOMENTUM, key[len(MOMENTUM):])
        unit = expert_of(name)
        if not key.startswith((PARAM, MOMENTUM)) or unit is None:
            raise ExpertMessageRefused(f"expert: {key[:80]!r} is not an expert parameter")
        shape.check(name, tensor, "expert")
        (params if kind == PARAM else momentum).setdefault(unit[1], {})[name] = tensor
    layout = shape.layout
    states = {}
    for expert in sorted(params.keys() | momentum.keys()):
        names = {n for key in layout.units_of((expert,)) for n in layout.units[key]}
        got = params.get(expert, {})
        if got.keys() != names:
            raise ExpertMessageRefused(f"expert: expert {expert} is incomplete ({len(got)} of {len(names)} parameters)")
        states[expert] = ExpertState(expert, got, momentum.get(expert, {}))
    return states


def params_digest(params: Mapping[str, torch.Tensor], names: Iterable[str]) -> str:
    """A short digest (32 hex digits of SHA-256) of the named parameters' names and raw bytes: what a
    commit says about a copy, so that copies that drifted apart are found."""
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(name.encode())
        digest.update(tensor_bytes(params[name]))
    return digest.hexdigest()[:32]

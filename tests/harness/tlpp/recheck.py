"""A TL++ orchestrator's steps checked against the protocol's result (fault tests and chaos
scripts; nothing in a daemon uses it).

``StepStates`` is a ``LocalNet`` watcher: at each ``tlpp.step`` event of an orchestrator (of any
of its lives: a resumed one too) it keeps the model's parameters and the optimizer's state after
the step, the step's virtual batch (each node's local indices) and its ledger; made before
training starts, it keeps the starting state as step -1's.

``recheck`` recomputes step s from the state after step s - 1 alone: the gradient of the mean
cross-entropy of the whole model over the samples of exactly the nodes the ledger says the step
used (the protocol's result over them: the split step reproduces this centralized gradient, and
a node dropped after the loss was taken is renormalised out, ``protocols.tlpp.steps``), read
from those nodes' own data at the batch's indices. It returns how far the applied step is from it:
with SGD, the parameters the run's optimizer gives from that gradient against those applied
(max abs); with Adam, whose update amplifies tiny gradient differences, the gradient the step
applied (read back exactly from Adam's first moment, m_t = b1 m_(t-1) + (1 - b1) g) against the
recomputed one. A step that applied nothing must have left parameters and moments bit-identical
(its gap is then 0, else inf).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.server import TlppServerRole, _optimizer
from gossamer.protocols.tlpp.settings import TlppSettings


@dataclass
class Kept:
    """The orchestrator's model and optimizer state after one step (cloned)."""

    params: dict[str, Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def of(cls, role: TlppServerRole) -> Kept:
        return cls({k: v.detach().clone() for k, v in role.model.state_dict().items()},
                   copy.deepcopy(role.optimizer.state_dict()))

    def same(self, other: Kept) -> bool:
        """Bit-identical parameters and optimizer moments."""
        return _equal(self.params, other.params) and all(
            _equal(a, other.optimizer["state"].get(i, {})) for i, a in self.optimizer["state"].items())


class StepStates:
    """What each step of the watched orchestrator applied (see the module docstring);
    ``server(name)`` is the net peer's ``tlpp-server`` role, None for another peer."""

    def __init__(self, server: Callable[[str], TlppServerRole | None], first: TlppServerRole) -> None:
        self.server = server
        self.after: dict[int, Kept] = {first.step - 1: Kept.of(first)}
        self.batches: dict[int, dict[str, list[int]]] = {}
        self.ledgers: dict[int, StepLedger] = {}

    def __call__(self, name: str, event: str, fields: Mapping[str, Any]) -> None:
        role = self.server(name) if event == "tlpp.step" else None
        if role is None:
            return
        step = int(fields["step"])
        self.after[step] = Kept.of(role)
        assert role.driver.batch is not None
        self.batches[step] = role.driver.batch.by_node()
        ledger = role.history.get(step)
        assert ledger is not None
        self.ledgers[step] = ledger


def recheck(step: int, *, states: StepStates, settings: TlppSettings, data: Mapping[str, Any]) -> float:
    """How far the applied ``step`` is from the protocol's result over the nodes it used (see the
    module docstring); ``data``: peer id -> the node's data (``x``, ``y``). KeyError when the step
    or the state before it was not kept."""
    ledger, before, after = states.ledgers[step], states.after[step - 1], states.after[step]
    if not ledger.applied:
        return 0.0 if before.same(after) else float("inf")
    plan = states.batches[step]
    used = sorted(ledger.used)
    x = torch.cat([data[n].x[plan[n]] for n in used])
    y = torch.cat([data[n].y[plan[n]] for n in used])
    model = settings.build_model("cpu")
    model.load_state_dict(before.params)
    names = [name for name, _ in model.named_parameters()]
    grads = dict(zip(names, torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters())), strict=True))
    optimizer = _optimizer(model, settings)
    optimizer.load_state_dict(copy.deepcopy(before.optimizer))
    if settings.optimizer == "adam":
        return _adam_gap(grads, names, before, after, settings)
    for name, param in model.named_parameters():
        param.grad = grads[name]
    optimizer.step()
    return max(float((param.detach() - after.params[name]).abs().max()) for name, param in model.named_parameters())


def _adam_gap(grads: dict[str, Tensor], names: list[str], before: Kept, after: Kept, settings: TlppSettings) -> float:
    """Max abs gap between the gradient Adam's first moment says was applied and ``grads`` (plus
    the weight decay Adam adds to the gradient)."""
    beta1 = after.optimizer["param_groups"][0]["betas"][0]
    gaps = []
    for i, name in enumerate(names):
        m_after = after.optimizer["state"][i]["exp_avg"]
        m_before = before.optimizer["state"].get(i, {}).get("exp_avg", torch.zeros_like(m_after))
        applied = (m_after - beta1 * m_before) / (1 - beta1)
        expected = grads[name] + settings.weight_decay * before.params[name]
        gaps.append(float((applied - expected).abs().max()))
    return max(gaps)


def _equal(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(v, b[k]) if isinstance(v, Tensor) else v == b[k] for k, v in a.items())

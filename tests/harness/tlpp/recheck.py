"""A TL++ orchestrator's steps checked against the protocol's result (fault tests, chaos scripts):
``StepStates`` keeps, at each ``tlpp.step`` of any life of the orchestrator, the model and optimizer
state, the virtual batch and the ledger; ``recheck`` recomputes a step from the state before it as
the centralized gradient over exactly the nodes its ledger used, and says how far the applied step
is from it (``protocols/tlpp/README.md``, "Faults")."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.orchestrator import TlppOrchestratorRole
from gossamer.protocols.tlpp.settings import TlppSettings


@dataclass
class Kept:
    """The orchestrator's model and optimizer state after one step (cloned)."""

    params: dict[str, Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def of(cls, role: TlppOrchestratorRole) -> Kept:
        return cls({k: v.detach().clone() for k, v in role.model.state_dict().items()},
                   copy.deepcopy(role.optimizer.state_dict()))

    def same(self, other: Kept) -> bool:
        """Bit-identical parameters and optimizer moments."""
        return _equal(self.params, other.params) and all(
            _equal(a, other.optimizer["state"].get(i, {})) for i, a in self.optimizer["state"].items())


class StepStates:
    """What each step of the watched orchestrator applied (a ``LocalNet`` watcher; made before
    training starts, it keeps the starting state as step -1's). ``orchestrator(name)`` is the net
    peer's ``tlpp-orchestrator`` role, None for another peer."""

    def __init__(self, orchestrator: Callable[[str], TlppOrchestratorRole | None],
                 first: TlppOrchestratorRole) -> None:
        self.orchestrator = orchestrator
        self.after: dict[int, Kept] = {first.step - 1: Kept.of(first)}
        self.batches: dict[int, dict[str, list[int]]] = {}
        self.ledgers: dict[int, StepLedger] = {}

    def __call__(self, name: str, event: str, fields: Mapping[str, Any]) -> None:
        role = self.orchestrator(name) if event == "tlpp.step" else None
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
    """How far the applied ``step`` is from the protocol's result over the nodes it used: with SGD,
    the parameters the optimizer gives from the recomputed gradient against those applied (max
    abs); with Adam, the gradient read back from its first moment against the recomputed one. A
    step that applied nothing must have left everything bit-identical (0, else inf). ``data``: peer
    id -> the node's data (``x``, ``y``); KeyError when the step or the state before it was not kept."""
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
    optimizer = settings.build_optimizer(model)
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

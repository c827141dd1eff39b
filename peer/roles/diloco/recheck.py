"""A learner's applied rounds checked against the protocol's result (fault tests and chaos
scripts; nothing in a daemon uses it).

``RoundStates`` is a ``LocalNet`` watcher: at each learner's ``round`` event it keeps that
learner's parameters and outer momentum (what the round applied, and the next round's start);
made before the learners start, it keeps their starting state as round -1's.
``recheck`` recomputes a learner's round t with ``protocols.learner_round.round_result`` from its
state at the end of round t - 1, its own pseudo-gradient as it sent it, and the parameters,
momenta and pseudo-gradients of exactly the learners its ledger says it used, as they sent them
(``sent(sender, recipient, path)``: the net's kept bodies, ``peer.testing.taps``), and returns
how far the learner's applied result is from it (max abs difference over every tensor).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gossamer.peer.roles.diloco.contributions import MOMENTUM
from gossamer.peer.roles.diloco.learner import LearnerRole
from gossamer.protocols.diloco import Params
from gossamer.protocols.learner_round import RoundInputs, round_result
from gossamer.protocols.models import flat_parameters

Sent = Callable[[str, str, str], dict[str, torch.Tensor]]
"""The tensors ``sender`` sent ``recipient`` at ``path`` (net names); KeyError if none were taken."""


class RoundStates:
    """What each watched learner applied at the end of each round: (parameters, outer momentum)."""

    def __init__(self, roles: Mapping[str, LearnerRole]) -> None:
        self.roles = dict(roles)
        self.states: dict[tuple[str, int], tuple[Params, Params]] = {
            (name, role.replica.round - 1): (flat_parameters(role.replica.module), role.replica.outer.state_dict())
            for name, role in self.roles.items()}

    def __call__(self, name: str, event: str, fields: Mapping[str, Any]) -> None:
        role = self.roles.get(name)
        if role is not None and event == "diloco.round":
            self.states[name, int(fields["round"])] = (flat_parameters(role.replica.module),
                                                       role.replica.outer.state_dict())


def recheck(name: str, round: int, *, states: RoundStates, sent: Sent, names: Mapping[str, str],
            perturb: float = 0.0) -> float:
    """Max abs difference between what learner ``name`` applied in ``round`` and the
    protocol's result over what its ledger says it used (``names``: peer id -> net name;
    ``perturb`` is added to the recomputation, to show a check built on this can fail)."""
    role = states.roles[name]
    settings = role.settings
    if settings.aggregator != "mean" or settings.w1_clip_tau > 0:
        raise ValueError(f"recheck recomputes the plain protocol (mean W2, no W1 clipping), not "
                         f"{settings.aggregator} with w1_clip_tau {settings.w1_clip_tau}")
    ledger = role.history.get(round)
    if ledger is None:
        raise KeyError(f"{name} has no ledger for round {round}")
    index = ledger.learners.index
    x, u = states.states[name, round - 1]
    u = {key: u.get(key, torch.zeros_like(value)) for key, value in x.items()}
    d = _own(name, round, ledger.pseudo_gradients.expected, sent, names)
    params, momenta = {}, {}
    for sender in ledger.params.used:
        message = sent(names[sender], name, f"/diloco/params/{round}")
        params[index(sender)] = {k: v for k, v in message.items() if not k.startswith(MOMENTUM)}
        momenta[index(sender)] = {k[len(MOMENTUM):]: v for k, v in message.items() if k.startswith(MOMENTUM)}
    pgrads = {index(s): sent(names[s], name, f"/diloco/pgrad/{round}") for s in ledger.pseudo_gradients.used}
    if set(d) != set(x):  # a round whose W2 covers a subset: the own d elsewhere never went out
        raise ValueError(f"{name} round {round}: its pseudo-gradient went out on a subset; recheck needs all of it")
    used = RoundInputs(me=index(role.peer_id), n=len(ledger.learners), x=x, u=u, d=d, params=params,
                       momenta=momenta, pgrads=pgrads)
    x_next, u_next = round_result(used, round=round, seed=settings.seed, plan=settings.mixing, config=settings.diloco)
    applied_x, applied_u = states.states[name, round]
    gaps = [(x_next[k] + perturb - applied_x[k]).abs().max() for k in x_next]
    gaps += [(u_next[k] - applied_u[k]).abs().max() for k in u_next]
    return max(float(gap) for gap in gaps)


def _own(name: str, round: int, recipients: list[str], sent: Sent, names: Mapping[str, str]) -> Params:
    """The learner's own pseudo-gradient of ``round``, as one of its recipients took it."""
    for recipient in recipients:
        try:
            return sent(name, names[recipient], f"/diloco/pgrad/{round}")
        except KeyError:
            continue
    raise KeyError(f"no recipient took {name}'s pseudo-gradient of round {round}")

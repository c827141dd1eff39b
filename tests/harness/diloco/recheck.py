"""A learner's applied rounds checked against the protocol's result (fault tests and chaos scripts):
``RoundStates`` (a ``LocalNet`` watcher) keeps what each learner applied at each round's end;
``recheck`` recomputes a round from the state before it and the contributions its ledger used,
with the pure functions alone (W1 mix or clipped gossip, fixed or adaptive, W2 mean or robust rule,
``learner_round.round_result``), and returns the largest gap to what was applied."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.contributions import MOMENTUM
from gossamer.protocols.diloco.core.aggregate import mix_parameters
from gossamer.protocols.diloco.core.learner_round import RoundInputs, round_result
from gossamer.protocols.diloco.core.replica import Params
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.diloco.ledger import RoundLedger
from gossamer.protocols.diloco.settings import DilocoSettings

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
    ledger = role.history.get(round)
    if ledger is None:
        raise KeyError(f"{name} has no ledger for round {round}")
    index, me = ledger.learners.index, role.peer_id
    x, u = states.states[name, round - 1]
    u = {key: u.get(key, torch.zeros_like(value)) for key, value in x.items()}
    d = _own(name, round, ledger.pseudo_gradients.expected, sent, names)
    if set(d) != set(x):  # a round whose W2 covers a subset: the own d elsewhere never went out
        raise ValueError(f"{name} round {round}: its pseudo-gradient went out on a subset; recheck needs all of it")
    params, momenta = {}, {}
    for sender in ledger.params.used:
        message = sent(names[sender], name, f"/diloco/params/{round}")
        params[sender] = {k: v for k, v in message.items() if not k.startswith(MOMENTUM)}
        momenta[sender] = {k[len(MOMENTUM):]: v for k, v in message.items() if k.startswith(MOMENTUM)}
    exchange = ledger.pseudo_gradients
    robust = settings.aggregator != "mean"
    pgrads = {s: sent(names[s], name, f"/diloco/pgrad/{round}") for s in (exchange.arrived if robust else exchange.used)}
    used = RoundInputs(me=index(me), n=len(ledger.learners), x=x, u=u, d=d,
                       params={index(s): v for s, v in params.items()},
                       momenta={index(s): v for s, v in momenta.items()},
                       pgrads={index(s): v for s, v in pgrads.items()})
    if settings.w1_clip_tau > 0 or settings.w1_clip_ratio > 0:  # clipped gossip: handed over done, as own x alone
        w1 = settings.mixing.w1_weights(used.n, round=round, seed=settings.text.seed)
        u_mixed = _clipped(u, momenta, w1, used.me, index, settings) if settings.mixing.mixes_momentum(round) else u
        used = replace(used, x=_clipped(x, params, w1, used.me, index, settings), params={}, u=u_mixed, momenta={})
    if robust:  # likewise the robust W2 mix
        d_mixed = _robust(role, ledger, d, pgrads, where=f"{name} round {round}")
        used = replace(used, d=d_mixed, pgrads={})
    x_next, u_next = round_result(used, round=round, seed=settings.text.seed, plan=settings.mixing, config=settings.diloco)
    applied_x, applied_u = states.states[name, round]
    gaps = [(x_next[k] + perturb - applied_x[k]).abs().max() for k in x_next]
    gaps += [(u_next[k] - applied_u[k]).abs().max() for k in u_next]
    return max(float(gap) for gap in gaps)


def _clipped(own: Params, arrived: Mapping[str, Params], weights: torch.Tensor, me: int, index: Callable[[str], int],
             settings: DilocoSettings) -> Params:
    """Clipped gossip of ``own`` with every neighbour that arrived (by peer id), with their W1 weights."""
    return mix_parameters(own, arrived, weights=weights, me=me, index_of=index, clip_tau=settings.w1_clip_tau,
                          clip_ratio=settings.w1_clip_ratio, max_norm=settings.text.max_norm)


def _robust(role: LearnerRole, ledger: RoundLedger, d: Params, arrived: Mapping[str, Params], *, where: str) -> Params:
    """The run's robust W2 mix of the own ``d`` and what arrived, the silent learners as failures;
    a ValueError when it uses other learners than the ledger says."""
    settings, learners, exchange = role.settings, ledger.learners, ledger.pseudo_gradients
    silent = {s: "timed out" for s in exchange.timed_out} | exchange.rejected
    weights = settings.mixing.w2_weights(len(learners), round=ledger.round, seed=settings.text.seed)
    outcome = settings.w2_aggregator(me=role.peer_id).aggregate(
        d, arrived, weights=weights, me=learners.index(role.peer_id), index_of=learners.index, silent=silent,
        round=ledger.round)
    chosen = sorted(set(outcome.used) - set(exchange.rejected))
    if chosen != exchange.used:
        raise ValueError(f"{where}: the ledger used {exchange.used}, {settings.aggregator} over what arrived {chosen}")
    return outcome.value


def _own(name: str, round: int, recipients: list[str], sent: Sent, names: Mapping[str, str]) -> Params:
    """The learner's own pseudo-gradient of ``round``, as one of its recipients took it."""
    for recipient in recipients:
        try:
            return sent(name, names[recipient], f"/diloco/pgrad/{round}")
        except KeyError:
            continue
    raise KeyError(f"no recipient took {name}'s pseudo-gradient of round {round}")

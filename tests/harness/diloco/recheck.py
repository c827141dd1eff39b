"""A learner's applied rounds checked against the protocol's result (fault tests and chaos
scripts; nothing in a daemon uses it).

``RoundStates`` is a ``LocalNet`` watcher: at each learner's ``round`` event it keeps that
learner's parameters and outer momentum (what the round applied, and the next round's start);
made before the learners start, it keeps their starting state as round -1's.
``recheck`` recomputes a learner's round t from its state at the end of round t - 1, its own
pseudo-gradient as it sent it, and the parameters, momenta and pseudo-gradients of the learners
its ledger names, as they sent them (``sent(sender, recipient, path)``: the net's kept bodies,
``peer.testing.taps``), and returns how far the learner's applied result is from it (max abs
difference over every tensor). Every run the manifest can configure is recomputed from the
protocol's pure functions:

- the W1 mix: ``mixing.mix`` renormalised over what arrived, or with ``w1_clip_tau > 0``
  ``robust.clipped_gossip`` over every parameter set that arrived (the momentum too, in rounds
  that mix it), each weighted by its W1 entry;
- the W2 mix: with the ``mean`` aggregator ``mixing.mix`` over the pseudo-gradients the ledger
  used; with any other aggregator of ``robust.AGGREGATORS`` the rule built from the manifest
  (``build_aggregator``, its f and parameters, ``max_norm``) run through
  ``robust.aggregate_or_degrade`` over every pseudo-gradient that arrived plus the own one, the
  timed-out and refused learners as failures: when too few arrived for the rule it degrades to
  the coordinate-wise median as the learner does, and when not even that can run the round's
  d~ is the own pseudo-gradient (``aggregate.PseudoGradientAggregator``'s fallback). The senders
  the rule used must be the ledger's ``used`` (a Krum that selected others than the ledger says
  is a ValueError);
- the rest, ``protocols.diloco.core.learner_round.round_result``: the plain mixes and the outer Nesterov step.
  A robust or clipped mix is handed to it already done, as the learner's own value with nothing
  from the others: a mix over one's own contribution alone is that contribution exactly
  (``mixing.mix``'s exactness (1)), so it only takes the outer step on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from gossamer.peer.kit.ledger import Exchange
from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.core.robust import (
    Contribution,
    Failure,
    aggregate_or_degrade,
    build_aggregator,
    clipped_gossip,
    flatten,
    unflatten,
)
from gossamer.protocols.diloco.contributions import MOMENTUM
from gossamer.protocols.diloco.core.learner_round import RoundInputs, round_result
from gossamer.protocols.diloco.core.replica import Params
from gossamer.protocols.diloco.learner import LearnerRole
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
    if settings.w1_clip_tau > 0:
        weights = settings.mixing.w1_weights(used.n, round=round, seed=settings.seed)
        row = {s: float(weights[used.me, index(s)]) for s in params}
        u_mixed = _clipped(u, momenta, row, settings) if settings.mixing.mixes_momentum(round) else u
        used = replace(used, x=_clipped(x, params, row, settings), params={}, u=u_mixed, momenta={})
    if robust:
        used = replace(used, d=_robust(me, d, pgrads, exchange, settings, where=f"{name} round {round}"), pgrads={})
    x_next, u_next = round_result(used, round=round, seed=settings.seed, plan=settings.mixing, config=settings.diloco)
    applied_x, applied_u = states.states[name, round]
    gaps = [(x_next[k] + perturb - applied_x[k]).abs().max() for k in x_next]
    gaps += [(u_next[k] - applied_u[k]).abs().max() for k in u_next]
    return max(float(gap) for gap in gaps)


def _clipped(own: Params, arrived: Mapping[str, Params], row: Mapping[str, float],
             settings: DilocoSettings) -> Params:
    """Clipped gossip of ``own`` with every neighbour that arrived (by peer id, W1 weight ``row``)."""
    neighbours = [Contribution(sender=s, vector=flatten(v)) for s, v in arrived.items()]
    mixed = clipped_gossip(flatten(own), neighbours, row, tau=settings.w1_clip_tau, max_norm=settings.max_norm)
    return unflatten(mixed, own)


def _robust(me: str, d: Params, arrived: Mapping[str, Params], exchange: Exchange, settings: DilocoSettings, *,
            where: str) -> Params:
    """The run's robust aggregate of the own ``d`` and what arrived; the own ``d`` when it cannot run."""
    params = dict(settings.aggregator_params)
    f = int(params.pop("f", 0))
    rule = build_aggregator(settings.aggregator, f=f, max_norm=settings.max_norm, **params)
    contributions = [Contribution(sender=s, vector=flatten(v)) for s, v in {**arrived, me: d}.items()]
    silent = [Failure(s, "timed out") for s in exchange.timed_out]
    silent += [Failure(s, why) for s, why in exchange.rejected.items() if s not in arrived]
    try:
        result, _note = aggregate_or_degrade(rule, contributions, silent, f=f, max_norm=settings.max_norm)
    except (InvalidSetting, NotEnoughUpdates):
        chosen, mixed = [], d
    else:
        chosen, mixed = sorted(set(result.used) - {me} - set(exchange.rejected)), {**d, **unflatten(result.value, d)}
    if chosen != exchange.used:
        raise ValueError(f"{where}: the ledger used {exchange.used}, {settings.aggregator} over what arrived {chosen}")
    return mixed


def _own(name: str, round: int, recipients: list[str], sent: Sent, names: Mapping[str, str]) -> Params:
    """The learner's own pseudo-gradient of ``round``, as one of its recipients took it."""
    for recipient in recipients:
        try:
            return sent(name, names[recipient], f"/diloco/pgrad/{round}")
        except KeyError:
            continue
    raise KeyError(f"no recipient took {name}'s pseudo-gradient of round {round}")

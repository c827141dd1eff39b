"""One gossip-DiLoCo learner's round recomputed from the contributions it used, with the pure
functions alone: the W1 mix renormalised over what arrived (no clipping), the W2 mean over what
arrived, the outer Nesterov step, the momentum mixed by W1 in the rounds the plan says. The fault
tests check a survivor's applied round against it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gossamer.protocols.diloco.core.mixing import MixingPlan, mix
from gossamer.protocols.diloco.core.replica import DilocoConfig, OuterNesterov, Params


@dataclass(frozen=True)
class RoundInputs:
    """What one learner (index ``me`` of ``n``) used in one round: its own parameters ``x`` and outer
    momentum ``u`` at the round's start and its pseudo-gradient ``d``; by learner index, the
    parameters (``params``), momenta (``momenta``, in rounds whose W1 mixes them) and
    pseudo-gradients (``pgrads``, on the round's W2 subset) it took from the others."""

    me: int
    n: int
    x: Params
    u: Params
    d: Params
    params: Mapping[int, Params] = field(default_factory=dict)
    momenta: Mapping[int, Params] = field(default_factory=dict)
    pgrads: Mapping[int, Params] = field(default_factory=dict)


def round_result(used: RoundInputs, *, round: int, seed: int, plan: MixingPlan,
                 config: DilocoConfig) -> tuple[Params, Params]:
    """The learner's parameters and outer momentum at the end of ``round``: m = W1 mix of x,
    u~ = W1 mix of u (when the round mixes momentum, else u), d~ = W2 mix of d on the round's
    subset (own d elsewhere), then u' = mu u~ + d~, x' = m - eta (d~ + mu u') (Nesterov)."""
    w1 = plan.w1_weights(used.n, round=round, seed=seed)
    w2 = plan.w2_weights(used.n, round=round, seed=seed)
    m, _ = mix(used.me, {used.me: used.x, **used.params}, w1)
    u_start = mix(used.me, {used.me: used.u, **used.momenta}, w1)[0] if plan.mixes_momentum(round) else used.u
    d_mixed, _ = mix(used.me, {used.me: used.d, **used.pgrads}, w2, names=plan.w2_names(used.d, round=round))
    outer = OuterNesterov.from_config(config)
    x_next = outer.step(m, d_mixed, u_start)
    return x_next, outer.state_dict()

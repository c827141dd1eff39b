"""What each learner of a gossip-DiLoCo arm sends per round, counted from the tensors the arm mixes,
and the compute utilisation it allows on a link (``cost_rows``); the network learner realises a
global mix as n - 1 sends rather than the all-reduce modelled here, so for large n it sends more."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from gossamer.protocols.diloco.core.mixing import MixingPlan, mixing_weights

RTT_S = 0.1
LINKS_MBIT = (100, 300)
MODELLED_STEP_S = 0.5
MODELLED_CONFIG = {"d_model": 1024, "n_layers": 12, "n_heads": 16, "context": 1024}
MODELLED_H = 500


@dataclass(frozen=True)
class Exchange:
    """One transfer a learner makes: bytes on its uplink, blocking or overlapped, times per round."""

    what: str
    size_bytes: float
    blocking: bool
    per_round: int = 1


def _copies(kind: str, n: int) -> float:
    """Times a learner's uplink carries the mixed bytes: 2(n-1)/n for a global all-reduce, else one
    copy per neighbour (nonzero off-diagonal entries of its column of W)."""
    if kind == "global":
        return 2 * (n - 1) / n
    w = mixing_weights(kind, n, round=0, seed=0)
    return int((w[:, 0] > 0).sum()) - int(w[0, 0] > 0)


def round_exchanges(plan: MixingPlan | None, *, exact: bool, n: int, full_bytes: int, subset_bytes: int,
                    inner_steps: int, shared_momentum: bool = False, w1_blocking: bool = False) -> list[Exchange]:
    """What each learner sends in one round of ``plan`` (None: data parallel); ``exact``: one of
    the plan's periodic exact averages (a global W1 of parameters and momentum and a global W2 over
    every parameter); ``w1_blocking``: W1 mixes the parameters after the outer step, so the next
    round waits for it. A gossip mix sends its tensors to each neighbour; a global mix is a ring
    all-reduce (2(n-1)/n x the bytes), overlapped with the inner phase for W1 and blocking for W2.
    W1 sends the parameters (twice that with the outer momentum), W2 the covered pseudo-gradients;
    DiLoCo sends no W1 (its replicas are identical); data parallel all-reduces every inner step."""
    allreduce = _copies("global", n)
    if plan is None:
        return [Exchange("gradient all-reduce", allreduce * full_bytes, True, inner_steps)]
    w1, w2 = ("global", "global") if exact else (plan.w1, plan.w2)
    diloco = plan.w1 == "global" and plan.w2 == "global" and plan.w2_subset == "all"
    out = []
    if not diloco and w1 != "none":
        momentum = plan.mix_momentum or exact
        out.append(Exchange(f"W1 {w1} params{' + momentum' if momentum else ''}",
                            _copies(w1, n) * full_bytes * (2 if momentum else 1), w1_blocking))
    w2_bytes = full_bytes if exact or plan.w2_subset == "all" else subset_bytes
    if w2 != "none":
        out.append(Exchange(f"W2 {w2} pseudo-gradients", _copies(w2, n) * w2_bytes, True))
    if shared_momentum:
        out.append(Exchange("momentum all-reduce", allreduce * full_bytes, True))
    return out


def cycle(plan: MixingPlan | None, **sizes: Any) -> list[list[Exchange]]:
    """The rounds of one period of ``plan``: k - 1 ordinary rounds and one exact round when it
    averages every k rounds, else one ordinary round."""
    every = plan.average_every if plan is not None else 0
    if not every:
        return [round_exchanges(plan, exact=False, **sizes)]
    return [round_exchanges(plan, exact=False, **sizes)] * (every - 1) + [round_exchanges(plan, exact=True, **sizes)]


def utilisation(rounds: list[list[Exchange]], *, step_s: float, inner_steps: int, link_mbit: float) -> float:
    """compute / wall over ``rounds``: each round's wall = max(compute, overlapped sends) + blocking
    sends, each exchange costing one RTT plus bytes / link rate."""
    def seconds(e: Exchange) -> float:
        return e.per_round * (RTT_S + 8 * e.size_bytes / (link_mbit * 1e6))

    compute_s = inner_steps * step_s
    wall_s = sum(max(compute_s, sum(seconds(e) for e in ex if not e.blocking))
                 + sum(seconds(e) for e in ex if e.blocking) for ex in rounds)
    return len(rounds) * compute_s / wall_s


def param_bytes(model: torch.nn.Module, keep: set[str] | None = None) -> int:
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters() if keep is None or name in keep)


def cost_rows(plan: MixingPlan | None, *, n: int, step_s: float, inner_steps: int, tiny: tuple[int, int],
              big: tuple[int, int], shared_momentum: bool = False, w1_blocking: bool = False) -> dict:
    """Bytes per round (averaged over a cycle) and utilisation: measured (tiny model, measured
    step), modelled (150M model, 0.5 s per inner step, at this run's H and at H = 500)."""
    cases = {"measured": (tiny, step_s, inner_steps), "modelled_H": (big, MODELLED_STEP_S, inner_steps),
             "modelled_H500": (big, MODELLED_STEP_S, MODELLED_H)}
    out = {}
    for case, ((full, subset), step, h) in cases.items():
        rounds = cycle(plan, n=n, full_bytes=full, subset_bytes=subset, inner_steps=h,
                       shared_momentum=shared_momentum, w1_blocking=w1_blocking)
        out[case] = {"bytes_per_round": sum(e.size_bytes * e.per_round for ex in rounds for e in ex) / len(rounds),
                     "exchanges": [[asdict(e) for e in ex] for ex in rounds],
                     **{f"util_{m}mbit": utilisation(rounds, step_s=step, inner_steps=h, link_mbit=m)
                        for m in LINKS_MBIT}}
    return out

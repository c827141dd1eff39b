"""The split of a TL++ step (``tlpp.py``): each party's pure functions on one virtual batch, run
serially and timed by party; *compute* is the model math (and the affine share ops), *share
generation* every ``share_float`` / ``reconstruct_float`` (timed by ``timed_sharing``)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import gossamer.protocols.tlpp.core.secure as tlpp_secure
from gossamer.crypto.sharing import MaskStream
from gossamer.protocols.tlpp.core import node_backward, node_forward, orchestrator_step, sum_grads
from gossamer.protocols.tlpp.settings import TlppSettings


@dataclass
class Stopwatch:
    """Seconds per label, accumulated over calls, and the elements shared while it watched."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    shared_numels: list[int] = field(default_factory=list)

    @contextmanager
    def span(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[label] += time.perf_counter() - start


@contextmanager
def timed_sharing(watch: Stopwatch) -> Iterator[None]:
    """While inside, every ``share_float`` / ``reconstruct_float`` the party functions of
    ``protocols.tlpp.core.secure`` call is timed into ``watch`` ("share", "reconstruct")."""
    share_float, reconstruct_float = tlpp_secure.share_float, tlpp_secure.reconstruct_float

    def timed_share(x: Tensor, masks: MaskStream) -> tuple[Tensor, Tensor]:
        watch.shared_numels.append(x.numel())
        with watch.span("share"):
            return share_float(x, masks)

    def timed_reconstruct(s0: Tensor, s1: Tensor, **kwargs: Any) -> Tensor:
        with watch.span("reconstruct"):
            return reconstruct_float(s0, s1, **kwargs)

    tlpp_secure.share_float, tlpp_secure.reconstruct_float = timed_share, timed_reconstruct
    try:
        yield
    finally:
        tlpp_secure.share_float, tlpp_secure.reconstruct_float = share_float, reconstruct_float


@dataclass
class Parties:
    """One mode's model (the orchestrator's master copy, its halves, its optimizer) and the nodes' streams."""

    model: nn.Sequential
    node_side: nn.Module
    server_side: nn.Module
    optimizer: torch.optim.Optimizer
    masks: dict[str, MaskStream]


def build_parties(settings: TlppSettings, nodes: list[str], device: torch.device) -> Parties:
    model = settings.build_model(device)
    node_side, server_side = settings.split(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    return Parties(model, node_side, server_side, optimizer, {n: MaskStream() for n in nodes})


def apply(parties: Parties, grads: Mapping[str, Tensor]) -> None:
    """The orchestrator's optimizer step with the summed gradients (as ``TlppOrchestratorRole._apply``)."""
    parties.optimizer.zero_grad(set_to_none=True)
    for name, param in parties.model.named_parameters():
        param.grad = grads[name].to(device=param.device, dtype=param.dtype)
    parties.optimizer.step()
    parties.optimizer.zero_grad(set_to_none=True)


def base_split(p: Parties, xs: dict[str, Tensor], ys: dict[str, Tensor], watch: Stopwatch) -> None:
    """One base-mode virtual batch through each party's functions, timed by party."""
    with watch.span("node"):
        acts = {n: node_forward(p.node_side, xs[n]) for n in xs}
    with watch.span("orchestrator"):
        server = orchestrator_step(p.server_side, acts, ys)
    with watch.span("node"):
        grads = [node_backward(p.node_side, xs[n], server.cut_grads[n]) for n in sorted(xs)]
    with watch.span("orchestrator"):
        apply(p, {**sum_grads(grads), **server.orchestrator_grads})


def secure_split(p: Parties, xs: dict[str, Tensor], ys: dict[str, Tensor], watch: Stopwatch, *,
                 settings: TlppSettings) -> None:
    """One secure-mode virtual batch through each party's functions (``protocols.tlpp.core.secure``), timed by
    party, with share generation and reconstruction timed inside."""
    guard = {"max_abs": settings.max_abs, "max_failure": settings.max_failure}
    with timed_sharing(watch):
        with watch.span("node"):
            pairs = {n: tlpp_secure.node_share_activations(p.node_side, xs[n], max_abs=settings.max_abs,
                                                           masks=p.masks[n]) for n in xs}
        with watch.span("helper"):
            theirs = tlpp_secure.party_logit_share({n: s[1] for n, s in pairs.items()}, p.server_side,
                                                    **guard)
        with watch.span("orchestrator"):
            own = tlpp_secure.party_logit_share({n: s[0] for n, s in pairs.items()}, p.server_side, **guard)
            bound = tlpp_secure.logit_bound(p.server_side, max_abs=settings.max_abs)
            step = tlpp_secure.orchestrator_logit_gradients(own, theirs, ys, bound=bound)
        scale = float(step.count)
        with watch.span("node"):
            shares = [tlpp_secure.node_gradient_shares(p.node_side, p.server_side, xs[n], step.logit_grads[n],
                                                       masks=p.masks[n], grad_scale=scale)
                      for n in sorted(xs)]
        with watch.span("helper"):
            helper_sum = tlpp_secure.party_sum([pair[1] for pair in shares])
        with watch.span("orchestrator"):
            grads = tlpp_secure.orchestrator_gradients(tlpp_secure.party_sum([pair[0] for pair in shares]),
                                                       helper_sum, grad_scale=scale,
                                                       layout=tlpp_secure.gradient_layout(p.node_side,
                                                                                          p.server_side))
            apply(p, grads)


def raw_keystream(numels: list[int], stream: MaskStream) -> float:
    """Seconds to draw the keystream of ``numels`` int64 shares, one call per tensor."""
    start = time.perf_counter()
    for numel in numels:
        stream.raw_bytes(8 * numel)
    return time.perf_counter() - start

"""TL++ secure mode: what each party computes on its own host (party 0 the orchestrator, party 1
the helper), as pure functions over additive shares (``crypto.sharing``). Every share is a
``PartyShare`` stamped with its party; a party's functions refuse shares of two parties, and only
the orchestrator's two reconstructions take the helper's share of what is revealed by design (the
logits, the gradient sums). The steps 1-6 are in ``protocols/tlpp/README.md``, "Secure mode"."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from gossamer.crypto.sharing import (
    FRAC_BITS,
    MaskStream,
    SharingError,
    affine_share,
    encode,
    reconstruct_float,
    share_float,
    sum_shares,
)
from gossamer.protocols.tlpp.core import affine_layer, logit_gradient

ORCHESTRATOR, HELPER = 0, 1
GradLayout = tuple[tuple[str, torch.Size], ...]


@dataclass(frozen=True)
class PartyShare:
    """One party's share of one tensor (ring elements), stamped with the party it belongs to."""

    party: int
    ring: Tensor


def _one_party(shares: Sequence[PartyShare], what: str) -> int:
    if not shares:
        raise SharingError(f"{what}: no shares")
    parties = {s.party for s in shares}
    if len(parties) != 1:
        raise SharingError(f"{what}: shares from parties {sorted(parties)}; a party only ever holds its own")
    return parties.pop()


def _pair(own: PartyShare, helper: PartyShare, what: str) -> None:
    if own.party != ORCHESTRATOR or helper.party != HELPER:
        raise SharingError(f"{what}: need the orchestrator's share and the helper's, got parties "
                           f"{own.party} and {helper.party}")


# --- node ---------------------------------------------------------------------------------------------


def node_share_activations(node_side: nn.Module, x: Tensor, *, max_abs: float,
                           masks: MaskStream) -> tuple[PartyShare, PartyShare]:
    """Step 2 on node i: cut activations below the cut, the magnitude check, and the two shares
    (to the orchestrator, to the helper)."""
    with torch.no_grad():
        a = node_side(x)
    largest = float(a.abs().max()) if a.numel() else 0.0
    if not largest <= max_abs:
        raise SharingError(f"activations: |A| reaches {largest:.6g} > max_abs {max_abs:.6g}, the bound the "
                           "truncation guard assumes; raise max_abs or normalise below the cut")
    s0, s1 = share_float(a, masks)
    return PartyShare(ORCHESTRATOR, s0), PartyShare(HELPER, s1)


def gradient_layout(node_side: nn.Module, orchestrator_side: nn.Module) -> GradLayout:
    """Names (the full model's) and shapes of every gradient a node shares, sorted by name: its
    trainable node-side parameters and the affine layer's weight (and bias). Every party derives
    it from the model, so the gradient shares travel as ONE flat vector in this order."""
    linear = affine_layer(orchestrator_side)
    names = {id(p): name for name, p in orchestrator_side.named_parameters()}
    named = [(n, p.shape) for n, p in node_side.named_parameters() if p.requires_grad]
    named += [(names[id(p)], p.shape) for p in (linear.weight, linear.bias) if p is not None]
    return tuple(sorted(named))


def layout_numel(layout: GradLayout) -> int:
    """Length of the flat gradient vector of ``layout``."""
    return sum(math.prod(shape) for _, shape in layout)


def flatten_grads(grads: Mapping[str, Tensor], layout: GradLayout) -> Tensor:
    """``grads`` as one vector in ``layout``'s order; SharingError unless names and shapes match."""
    if set(grads) != {name for name, _ in layout}:
        raise SharingError(f"flatten_grads: gradients {sorted(grads)} do not match the layout "
                           f"{[name for name, _ in layout]}")
    for name, shape in layout:
        if grads[name].shape != shape:
            raise SharingError(f"flatten_grads: {name!r} is {tuple(grads[name].shape)}, expected {tuple(shape)}")
    return torch.cat([grads[name].reshape(-1) for name, _ in layout])


def unflatten_grads(vector: Tensor, layout: GradLayout) -> dict[str, Tensor]:
    """The inverse of ``flatten_grads``: tensors by name from one vector in ``layout``'s order."""
    if vector.dim() != 1 or vector.numel() != layout_numel(layout):
        raise SharingError(f"unflatten_grads: vector of shape {tuple(vector.shape)}, expected "
                           f"({layout_numel(layout)},)")
    parts = torch.split(vector, [math.prod(shape) for _, shape in layout])
    return {name: part.reshape(shape) for (name, shape), part in zip(layout, parts, strict=True)}


def node_gradient_shares(node_side: nn.Module, orchestrator_side: nn.Module, x: Tensor, logit_grad: Tensor, *,
                         masks: MaskStream, grad_scale: float = 1.0) -> tuple[PartyShare, PartyShare]:
    """Step 5 on node i: from its own g_i, A_i and W, the affine layer's gradients (g_i^T A_i,
    sum g_i) and its node-side gradients (backprop of g_i W), all times ``grad_scale``, flattened
    in ``gradient_layout`` order and shared with one ``share_float`` call (one message per party,
    one keystream draw). Returns (to the orchestrator, to the helper)."""
    linear = affine_layer(orchestrator_side)
    names = {id(p): name for name, p in orchestrator_side.named_parameters()}
    node_named = [(n, p) for n, p in node_side.named_parameters() if p.requires_grad]
    with torch.enable_grad():
        a = node_side(x)
        g = logit_grad.to(a)
        if g.shape != (a.shape[0], linear.out_features):
            raise SharingError(f"logit_grad: shape {tuple(g.shape)}, expected "
                               f"{(a.shape[0], linear.out_features)}")
        node_grads = torch.autograd.grad(a, [p for _, p in node_named],
                                         grad_outputs=g @ linear.weight.detach(), allow_unused=True)
    grads = {name: torch.zeros_like(p) if d is None else d for (name, p), d in zip(node_named, node_grads,
                                                                                    strict=True)}
    grads[names[id(linear.weight)]] = g.T @ a.detach()
    if linear.bias is not None:
        grads[names[id(linear.bias)]] = g.sum(dim=0)
    flat = flatten_grads(grads, gradient_layout(node_side, orchestrator_side))
    s0, s1 = share_float(flat * grad_scale, masks)
    return PartyShare(ORCHESTRATOR, s0), PartyShare(HELPER, s1)


# --- each party -----------------------------------------------------------------------------------------


def party_logit_share(shares: Mapping[str, PartyShare], orchestrator_side: nn.Module, *, max_abs: float,
                       max_failure: float) -> PartyShare:
    """Step 3 on one party: its share of the logits for the batch (nodes concatenated in sorted
    order) from ITS shares of every node's activations; refuses shares of two parties."""
    linear = affine_layer(orchestrator_side)
    nodes = sorted(shares)
    party = _one_party([shares[n] for n in nodes], "party_logit_share")
    stacked = torch.cat([shares[n].ring for n in nodes])
    out = affine_share(stacked, linear.weight.detach(), None if linear.bias is None else linear.bias.detach(),
                       party=party, max_abs=max_abs, max_failure=max_failure)
    return PartyShare(party, out)


def party_sum(shares: Sequence[PartyShare]) -> PartyShare:
    """Step 6 on one party: the sum over nodes of its own flat gradient shares."""
    if not shares:
        raise SharingError("party_sum: no node's shares")
    party = _one_party(shares, "party_sum")
    return PartyShare(party, sum_shares([s.ring for s in shares]))


# --- orchestrator -------------------------------------------------------------------------------------------


@dataclass
class LogitStep:
    """What the orchestrator learns in step 4: loss, correct, count, the logits and each node's g_i."""

    loss: float
    correct: int
    count: int
    logits: Tensor
    logit_grads: dict[str, Tensor]


def logit_bound(orchestrator_side: nn.Module, *, max_abs: float) -> float:
    """The largest |logit| a correct truncation can produce for |A| <= max_abs (guard premise plus
    fixed-point slack); anything larger is a failed truncation."""
    linear = affine_layer(orchestrator_side)
    row_l1 = float(encode(linear.weight.detach()).abs().to(torch.float64).sum(dim=1).max()) / 2 ** FRAC_BITS
    bias = 0.0 if linear.bias is None else float(linear.bias.detach().abs().max())
    return (max_abs + 2.0 ** -(FRAC_BITS + 1)) * row_l1 + bias + 2.0 ** -(FRAC_BITS - 2)


def orchestrator_logit_gradients(own: PartyShare, helper: PartyShare, labels: Mapping[str, Tensor], *,
                                 bound: float) -> LogitStep:
    """Step 4: reconstruct the logits, check them against ``bound`` (``logit_bound``), compute the
    loss and g over the whole batch and slice g per node (sorted order, sizes from ``labels``)."""
    _pair(own, helper, "orchestrator_logit_gradients")
    nodes = sorted(labels)
    logits = reconstruct_float(own.ring, helper.ring)
    worst = float(logits.abs().max()) if logits.numel() else 0.0
    if not worst <= bound:
        raise SharingError(f"truncation failure detected: a logit of magnitude {worst:.3g} exceeds the bound "
                           f"{bound:.3g}; the step is refused")
    y = torch.cat([labels[n] for n in nodes])
    loss, g, correct = logit_gradient(logits, y)
    slices = torch.split(g, [labels[n].shape[0] for n in nodes])
    return LogitStep(loss=loss, correct=correct, count=int(y.shape[0]), logits=logits,
                     logit_grads=dict(zip(nodes, slices, strict=True)))


def orchestrator_gradients(own: PartyShare, helper: PartyShare, *, layout: GradLayout,
                           grad_scale: float = 1.0) -> dict[str, Tensor]:
    """Step 6's end: the summed gradients, reconstructed from the two parties' summed flat shares
    and unflattened by name with ``layout`` (``gradient_layout``)."""
    _pair(own, helper, "orchestrator_gradients")
    return unflatten_grads(reconstruct_float(own.ring, helper.ring) / grad_scale, layout)


# --- one whole virtual batch in one process -----------------------------------------------------------------


@dataclass
class ByteLedger:
    """Bytes each (sender, receiver) link carried, counted from the tensors handed over."""

    links: dict[tuple[str, str], int] = field(default_factory=dict)

    def send(self, sender: str, receiver: str, tensors: Mapping[str, Tensor] | Sequence[Tensor] | Tensor):
        """Count ``tensors`` on the link and return what the receiver gets (detached clones)."""
        items = [tensors] if isinstance(tensors, Tensor) else list(
            tensors.values() if isinstance(tensors, Mapping) else tensors)
        size = sum(t.numel() * t.element_size() for t in items)
        self.links[(sender, receiver)] = self.links.get((sender, receiver), 0) + size
        if isinstance(tensors, Tensor):
            return tensors.detach().clone()
        if isinstance(tensors, Mapping):
            return {k: v.detach().clone() for k, v in tensors.items()}
        return [t.detach().clone() for t in items]

    @property
    def total_bytes(self) -> int:
        return sum(self.links.values())


@dataclass
class SecureStep:
    """One secure virtual batch: loss, correct, count, the revealed logits, the summed gradients of
    every parameter (full model names) and the ledger of bytes exchanged."""

    loss: float
    correct: int
    count: int
    logits: Tensor
    grads: dict[str, Tensor]
    ledger: ByteLedger


def _ring(share: PartyShare, ledger: ByteLedger, sender: str, receiver: str) -> PartyShare:
    return PartyShare(share.party, ledger.send(sender, receiver, share.ring))


def secure_step(node_side: nn.Module, orchestrator_side: nn.Module, xs: Mapping[str, Tensor],
                labels: Mapping[str, Tensor], *, max_abs: float, max_failure: float = 1e-6,
                masks: Mapping[str, MaskStream] | None = None) -> SecureStep:
    """Run one virtual batch through steps 1-6, each party on its own copies of what it received.
    ``masks`` gives each node's stream (default: freshly keyed from os.urandom). Nothing of the
    model is changed: the caller applies ``grads``."""
    affine_layer(orchestrator_side)  # refuse a non-affine orchestrator side before anything is shared
    nodes = sorted(xs)
    if not nodes or set(labels) != set(nodes):
        raise SharingError(f"secure_step: nodes with data {nodes} and with labels {sorted(labels)} "
                           "must match")
    masks = {n: MaskStream() for n in nodes} if masks is None else masks
    ledger = ByteLedger()
    helper_side = copy.deepcopy(orchestrator_side)
    helper_side.load_state_dict(ledger.send("orchestrator", "helper", orchestrator_side.state_dict()))
    local, to_orch, to_help, ys = {}, {}, {}, {}
    for n in nodes:
        local[n] = (copy.deepcopy(node_side), copy.deepcopy(orchestrator_side))
        local[n][0].load_state_dict(ledger.send("orchestrator", n, node_side.state_dict()))
        local[n][1].load_state_dict(ledger.send("orchestrator", n, orchestrator_side.state_dict()))
        s0, s1 = node_share_activations(local[n][0], xs[n], max_abs=max_abs, masks=masks[n])
        to_orch[n], to_help[n] = _ring(s0, ledger, n, "orchestrator"), _ring(s1, ledger, n, "helper")
        ys[n] = ledger.send(n, "orchestrator", labels[n])
    own = party_logit_share(to_orch, orchestrator_side, max_abs=max_abs, max_failure=max_failure)
    theirs = _ring(party_logit_share(to_help, helper_side, max_abs=max_abs, max_failure=max_failure),
                   ledger, "helper", "orchestrator")
    step = orchestrator_logit_gradients(own, theirs, ys, bound=logit_bound(orchestrator_side, max_abs=max_abs))
    grad_scale = float(step.count)
    orch_shares, help_shares = [], []
    for n in nodes:
        g = ledger.send("orchestrator", n, step.logit_grads[n].to(xs[n].dtype))
        s0, s1 = node_gradient_shares(*local[n], xs[n], g, masks=masks[n], grad_scale=grad_scale)
        orch_shares.append(_ring(s0, ledger, n, "orchestrator"))
        help_shares.append(_ring(s1, ledger, n, "helper"))
    helper_sum = _ring(party_sum(help_shares), ledger, "helper", "orchestrator")
    grads = orchestrator_gradients(party_sum(orch_shares), helper_sum,
                                   layout=gradient_layout(node_side, orchestrator_side), grad_scale=grad_scale)
    dtype = next(node_side.parameters()).dtype
    return SecureStep(loss=step.loss, correct=step.correct, count=step.count, logits=step.logits,
                      grads={k: v.to(dtype) for k, v in grads.items()}, ledger=ledger)

"""One step's math on each side of the cut: the node's forward and backward, the orchestrator's
step on the whole virtual batch, the summed node gradients, and the closed-form logit
gradient of the secure path. Every input a peer sends is checked, and refused naming the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gossamer.protocols.tlpp.core.errors import TraversalError


def node_forward(node_side: nn.Module, x: Tensor) -> Tensor:
    """A node's cut activations for its samples (no graph kept: ``node_backward`` recomputes)."""
    with torch.no_grad():
        return node_side(x)


def _named_trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


@dataclass
class OrchestratorStep:
    """The orchestrator's result for one virtual batch: mean loss over the whole batch, correct
    predictions, batch size, each node's cut-gradient slice and the orchestrator-side gradients."""

    loss: float
    correct: int
    count: int
    cut_grads: dict[str, Tensor]
    orchestrator_grads: dict[str, Tensor]


def _check_labels(node: str, labels: object, rows: int) -> Tensor:
    if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.dtype.is_floating_point:
        raise TraversalError(f"labels[{node!r}]: need a 1-D integer tensor, got {labels!r:.80}")
    if labels.shape[0] != rows:
        raise TraversalError(f"labels[{node!r}]: {labels.shape[0]} labels for {rows} activation rows")
    return labels


def _check_batch(activations: Mapping[str, Tensor], labels: Mapping[str, Tensor]) -> list[str]:
    if not activations:
        raise TraversalError("activations: empty virtual batch")
    nodes = sorted(activations)
    extra, missing = sorted(set(labels) - set(nodes)), sorted(set(nodes) - set(labels))
    if extra or missing:
        raise TraversalError(f"labels: nodes without activations {extra}, activations without labels "
                             f"{missing}")
    first = activations[nodes[0]]
    for node in nodes:
        a = activations[node]
        if not isinstance(a, Tensor) or not a.dtype.is_floating_point or a.dim() < 2 or a.shape[0] < 1:
            raise TraversalError(f"activations[{node!r}]: need a float tensor [rows >= 1, ...], "
                                 f"got {a!r:.80}")
        if a.shape[1:] != first.shape[1:] or a.dtype != first.dtype:
            raise TraversalError(f"activations[{node!r}]: shape {tuple(a.shape)} {a.dtype} does not match "
                                 f"{nodes[0]!r}'s {tuple(first.shape)} {first.dtype}")
        _check_labels(node, labels[node], a.shape[0])
    return nodes


def _check_classes(labels: Tensor, num_classes: int) -> None:
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise TraversalError(f"labels: values must lie in [0, {num_classes}), got [{int(labels.min())}, "
                             f"{int(labels.max())}]")


def orchestrator_step(orchestrator_side: nn.Module, activations: Mapping[str, Tensor],
                labels: Mapping[str, Tensor]) -> OrchestratorStep:
    """Run the orchestrator side on the concatenated cut activations (nodes sorted), take the mean
    cross-entropy over the whole virtual batch and return every node's cut-gradient slice and the
    orchestrator-side parameter gradients (by name; ``.grad`` fields are left untouched)."""
    nodes = _check_batch(activations, labels)
    cut = torch.cat([activations[n].detach() for n in nodes]).requires_grad_(True)
    y = torch.cat([labels[n] for n in nodes]).to(cut.device)
    logits = orchestrator_side(cut)
    if logits.dim() != 2:
        raise TraversalError(f"orchestrator side: logits must be [rows, classes], got {tuple(logits.shape)}")
    _check_classes(y, logits.shape[1])
    loss = F.cross_entropy(logits, y)
    named = _named_trainable(orchestrator_side)
    grads = torch.autograd.grad(loss, [cut] + [p for _, p in named])
    slices = torch.split(grads[0], [activations[n].shape[0] for n in nodes])
    return OrchestratorStep(
        loss=float(loss.detach()),
        correct=int((logits.detach().argmax(dim=1) == y).sum()),
        count=int(y.shape[0]),
        cut_grads=dict(zip(nodes, slices, strict=True)),
        orchestrator_grads={name: g for (name, _), g in zip(named, grads[1:], strict=True)},
    )


def node_backward(node_side: nn.Module, x: Tensor, cut_grad: Tensor) -> dict[str, Tensor]:
    """A node's parameter gradients (by name) from its cut-gradient slice: recompute the forward on
    ``x`` and backpropagate ``cut_grad``. Unused parameters get zeros, so every node returns the
    same names."""
    named = _named_trainable(node_side)
    with torch.enable_grad():
        out = node_side(x)
        if not isinstance(cut_grad, Tensor) or cut_grad.shape != out.shape:
            shape = tuple(cut_grad.shape) if isinstance(cut_grad, Tensor) else type(cut_grad).__name__
            raise TraversalError(f"cut_grad: shape {shape} does not match the activations' "
                                 f"{tuple(out.shape)}")
        grads = torch.autograd.grad(out, [p for _, p in named], grad_outputs=cut_grad.to(out),
                                    allow_unused=True)
    return {name: torch.zeros_like(p) if g is None else g for (name, p), g in zip(named, grads, strict=True)}


def sum_grads(grads: Iterable[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The SUM of the nodes' gradients (each already carries its share of the batch mean)."""
    grads = list(grads)
    if not grads:
        raise TraversalError("grads: nothing to sum")
    names = set(grads[0])
    for i, g in enumerate(grads[1:], start=1):
        if set(g) != names:
            raise TraversalError(f"grads[{i}]: names differ from grads[0]: {sorted(set(g) ^ names)}")
    out = {}
    for name in grads[0]:
        shapes = {tuple(g[name].shape) for g in grads}
        if len(shapes) != 1:
            raise TraversalError(f"grads: {name!r} has different shapes {sorted(shapes)}")
        out[name] = torch.stack([g[name] for g in grads]).sum(dim=0)
    return out


def logit_gradient(logits: Tensor, labels: Tensor) -> tuple[float, Tensor, int]:
    """(mean cross-entropy, dL/dlogits = (softmax - onehot) / N, correct) in closed form, for the
    secure path where the orchestrator holds reconstructed logits but no graph."""
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise TraversalError(f"logits: need a float tensor [rows, classes], got {logits!r:.80}")
    labels = _check_labels("all", labels, logits.shape[0]).to(logits.device)
    if logits.shape[0] < 1:
        raise TraversalError("logits: empty batch")
    _check_classes(labels, logits.shape[1])
    log_p = torch.log_softmax(logits, dim=1)
    loss = -log_p.gather(1, labels[:, None]).mean()
    g = (log_p.exp() - F.one_hot(labels, logits.shape[1]).to(logits.dtype)) / logits.shape[0]
    return float(loss), g, int((logits.argmax(dim=1) == labels).sum())

"""TL++ traversal learning: virtual batches, the model split at the cut, and the exact gradient path.

Traversal learning (Batool et al., "Traversal Learning: A Lossless and Efficient Distributed
Learning Framework", 2025; TL++ is gossamer's name for it with the secure server path) trains one
model on data that stays on its **data nodes**. The **orchestrator** holds the master model and
its optimizer. A **virtual batch** is drawn from the global (node, local index) list, shuffled each
epoch with (seed, epoch), and grouped by node. One step (base mode):

1. the orchestrator sends each node of the batch the node-side weights (the stages below the
   **cut**);
2. each node runs them on its samples and sends the cut activations A_i and labels y_i;
3. the orchestrator concatenates them (nodes in sorted order), runs the server side, takes the
   mean cross-entropy over the WHOLE virtual batch and returns each node its slice dA_i of the
   cut gradient;
4. each node backpropagates dA_i and returns its node-side parameter gradients; the orchestrator
   SUMS them (each slice already carries the 1/B of the batch mean) and steps its optimizer.

The sum of the node gradients plus the server gradients is exactly the gradient of centralized
training on the same batch (a test checks it to 1e-10 in float64) as long as nothing below the
cut couples samples of a batch: BatchNorm there is refused (``check_node_side``), as is dropout
(the node recomputes its forward in step 4 and would draw a different mask).

Names: ``split_model`` slices an ``nn.Sequential`` of stages, and slicing keeps the keys, so the
node side's and server side's parameter names are the full model's names (``"0.0.weight"``). The
two sides SHARE their modules with the model (no copies): the orchestrator's optimizer over the
master model sees every update; a data node works on its own copy, loaded from the node side's
``state_dict`` that step 1 sends.

Secure mode (``peer.roles.tlpp.secure``) needs the server side to be affine (``affine_server``) and
computes the loss from reconstructed logits with ``logit_gradient``.

Byte accounting (``tlpp_step_bytes``, ``tlpp_secure_step_bytes``, ``full_sync_step_bytes``) is
the formulas the experiment compares its counted bytes with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gossamer.protocols.errors import ProtocolError

__all__ = [
    "ServerStep",
    "TraversalError",
    "VirtualBatch",
    "VirtualBatchScheduler",
    "affine_server",
    "check_node_side",
    "digits_cnn",
    "full_sync_step_bytes",
    "logit_gradient",
    "node_backward",
    "node_forward",
    "server_step",
    "split_model",
    "sum_grads",
    "tlpp_secure_step_bytes",
    "tlpp_step_bytes",
]


class TraversalError(ProtocolError):
    """A TL++ input or model that cannot work; the message names the field or layer."""


def _count(name: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TraversalError(f"{name}: must be an int >= {low}, got {value!r}")
    return value


# --- virtual batches ----------------------------------------------------------------------------


@dataclass(frozen=True)
class VirtualBatch:
    """One step's samples: ``order`` is (node id, local index), grouped by node (nodes sorted), each
    node's samples in the order the epoch's shuffle drew them. Activations are concatenated and
    gradients sliced in exactly this order."""

    epoch: int
    index: int
    order: tuple[tuple[str, int], ...]

    def by_node(self) -> dict[str, list[int]]:
        """Each node's local indices, nodes in sorted order."""
        out: dict[str, list[int]] = {}
        for node, local in self.order:
            out.setdefault(node, []).append(local)
        return out

    def sizes(self) -> dict[str, int]:
        """How many samples each node contributes: the split sizes that route gradient slices back."""
        return {node: len(indices) for node, indices in self.by_node().items()}


class VirtualBatchScheduler:
    """Cuts each epoch's shuffle of the global (node, index) list into virtual batches.

    The shuffle depends only on (seed, epoch) and the counts, so the orchestrator can replay any
    epoch and every node could check the schedule it is asked to follow.
    """

    def __init__(self, counts: Mapping[str, int], *, batch_size: int, seed: int,
                 drop_last: bool = False) -> None:
        if not isinstance(counts, Mapping) or not counts:
            raise TraversalError("counts: need at least one node with samples")
        for node, count in counts.items():
            if not isinstance(node, str) or not node:
                raise TraversalError(f"counts: node ids must be non-empty strings, got {node!r}")
            _count(f"counts[{node!r}]", count, low=1)
        self.counts = {node: counts[node] for node in sorted(counts)}
        self.batch_size = _count("batch_size", batch_size, low=1)
        self.seed = _count("seed", seed, low=0)
        self.drop_last = bool(drop_last)
        self.total = sum(self.counts.values())
        if self.drop_last and self.total < self.batch_size:
            raise TraversalError(f"batch_size: {batch_size} > {self.total} samples: drop_last leaves "
                                 "no batch")

    @property
    def steps_per_epoch(self) -> int:
        whole, rest = divmod(self.total, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def epoch(self, epoch: int) -> list[VirtualBatch]:
        """The epoch's virtual batches: every sample exactly once (but a dropped short tail)."""
        _count("epoch", epoch, low=0)
        nodes = list(self.counts)
        node_of = np.repeat(np.arange(len(nodes)), [self.counts[n] for n in nodes])
        local_of = np.concatenate([np.arange(self.counts[n]) for n in nodes])
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.total)
        batches = []
        for index in range(self.steps_per_epoch):
            picked = perm[index * self.batch_size:(index + 1) * self.batch_size]
            grouped = picked[np.argsort(node_of[picked], kind="stable")]
            order = tuple((nodes[node_of[i]], int(local_of[i])) for i in grouped)
            batches.append(VirtualBatch(epoch=epoch, index=index, order=order))
        return batches

    def without(self, node_ids: Iterable[str]) -> VirtualBatchScheduler:
        """The schedule after ``node_ids`` left (same batch size, seed and drop_last)."""
        leaving = set(node_ids)
        unknown = sorted(leaving - set(self.counts))
        if unknown:
            raise TraversalError(f"node_ids: unknown nodes {unknown}")
        remaining = {node: count for node, count in self.counts.items() if node not in leaving}
        if not remaining:
            raise TraversalError("node_ids: every node would leave; a schedule needs at least one")
        return VirtualBatchScheduler(remaining, batch_size=self.batch_size, seed=self.seed,
                                     drop_last=self.drop_last)


# --- the model and its split ----------------------------------------------------------------------


def digits_cnn(*, channels: tuple[int, int, int] = (16, 32, 32), hidden: int = 64, num_classes: int = 10,
               seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               ) -> nn.Sequential:
    """A 4-stage CNN for 8x8 single-channel images (sklearn digits), input [N, 1, 8, 8].

    Stages 1-3: conv 3x3 (padding 1) + ReLU + 2x2 max-pool (8 -> 4 -> 2 -> 1); stage 3 then flattens
    and adds Linear(hidden) + ReLU; stage 4 is Linear(num_classes), the affine server side of cut 3.
    No BatchNorm, so every cut is exact. Weights are drawn from a generator seeded with ``seed``
    (uniform +-1/sqrt(fan_in), PyTorch's default bound), never from the global RNG.
    """
    if len(channels) != 3:
        raise TraversalError(f"channels: need 3 conv widths, got {channels!r}")
    for i, width in enumerate(channels):
        _count(f"channels[{i}]", width, low=1)
    _count("hidden", hidden, low=1)
    _count("num_classes", num_classes, low=2)
    c1, c2, c3 = channels

    def conv(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]

    with torch.device("meta"):
        model = nn.Sequential(
            nn.Sequential(*conv(1, c1)),
            nn.Sequential(*conv(c1, c2)),
            nn.Sequential(*conv(c2, c3), nn.Flatten(), nn.Linear(c3, hidden), nn.ReLU()),
            nn.Sequential(nn.Linear(hidden, num_classes)),
        )
    model = model.to_empty(device=device).to(dtype)
    generator = torch.Generator().manual_seed(_count("seed", seed, low=0))
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, nn.Conv2d | nn.Linear):
                bound = 1.0 / math.sqrt(layer.weight[0].numel())
                for tensor in (layer.weight, layer.bias):
                    draw = torch.rand(tensor.shape, generator=generator, dtype=torch.float64)
                    tensor.copy_((2 * draw - 1) * bound)
    return model


_STOCHASTIC = (nn.modules.dropout._DropoutNd,)


def check_node_side(node_side: nn.Module) -> None:
    """Refuse layers below the cut that break the exact summed gradient: BatchNorm (its statistics
    couple the samples of a batch, and a node sees only its slice) and dropout with p > 0 (the node
    recomputes its forward for the backward pass and would draw a different mask)."""
    for name, layer in node_side.named_modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            raise TraversalError(f"node side: {name or 'module'} is {type(layer).__name__}, which "
                                 "couples the samples of a batch; move the cut below it or use "
                                 "GroupNorm/LayerNorm")
        if isinstance(layer, _STOCHASTIC) and layer.p > 0:
            raise TraversalError(f"node side: {name or 'module'} is {type(layer).__name__}(p={layer.p}); "
                                 "a recomputed forward would draw a different mask")


def split_model(model: nn.Sequential, cut: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(node side, server side) = (stages [0, cut), stages [cut, end)). Both share their modules with
    ``model`` and keep its parameter names; the node side passes ``check_node_side``."""
    if not isinstance(model, nn.Sequential):
        raise TraversalError(f"model: need an nn.Sequential of stages, got {type(model).__name__}")
    if isinstance(cut, bool) or not isinstance(cut, int) or not 1 <= cut < len(model):
        raise TraversalError(f"cut: must be an int in [1, {len(model) - 1}] for {len(model)} stages, "
                             f"got {cut!r}")
    node_side, server_side = model[:cut], model[cut:]
    check_node_side(node_side)
    return node_side, server_side


def affine_server(server_side: nn.Module) -> nn.Linear:
    """The server side's single ``nn.Linear`` (secure mode computes on shares only through an affine
    map). Anything else is refused: a non-linearity on shares would need an approximation or a
    protocol gossamer does not run, and silently approximating is not an option."""
    leaves = [(name, m) for name, m in server_side.named_modules()
              if not list(m.children()) and not isinstance(m, nn.Identity)]
    if len(leaves) == 1 and isinstance(leaves[0][1], nn.Linear):
        return leaves[0][1]
    found = ", ".join(f"{name}: {type(m).__name__}" for name, m in leaves) or "no layers"
    raise TraversalError(f"secure mode needs the server side to be one nn.Linear (an affine map on shares); "
                         f"found {found}; move the cut up to the last Linear")


# --- one step -----------------------------------------------------------------------------------------


def node_forward(node_side: nn.Module, x: Tensor) -> Tensor:
    """A node's cut activations for its samples (no graph kept: ``node_backward`` recomputes)."""
    with torch.no_grad():
        return node_side(x)


def _named_trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


@dataclass
class ServerStep:
    """The orchestrator's result for one virtual batch: mean loss over the whole batch, correct
    predictions, batch size, each node's cut-gradient slice and the server-side gradients."""

    loss: float
    correct: int
    count: int
    cut_grads: dict[str, Tensor]
    server_grads: dict[str, Tensor]


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


def server_step(server_side: nn.Module, activations: Mapping[str, Tensor],
                labels: Mapping[str, Tensor]) -> ServerStep:
    """Run the server side on the concatenated cut activations (nodes sorted), take the mean
    cross-entropy over the whole virtual batch and return every node's cut-gradient slice and the
    server-side parameter gradients (by name; ``.grad`` fields are left untouched)."""
    nodes = _check_batch(activations, labels)
    cut = torch.cat([activations[n].detach() for n in nodes]).requires_grad_(True)
    y = torch.cat([labels[n] for n in nodes]).to(cut.device)
    logits = server_side(cut)
    if logits.dim() != 2:
        raise TraversalError(f"server side: logits must be [rows, classes], got {tuple(logits.shape)}")
    _check_classes(y, logits.shape[1])
    loss = F.cross_entropy(logits, y)
    named = _named_trainable(server_side)
    grads = torch.autograd.grad(loss, [cut] + [p for _, p in named])
    slices = torch.split(grads[0], [activations[n].shape[0] for n in nodes])
    return ServerStep(
        loss=float(loss.detach()),
        correct=int((logits.detach().argmax(dim=1) == y).sum()),
        count=int(y.shape[0]),
        cut_grads=dict(zip(nodes, slices, strict=True)),
        server_grads={name: g for (name, _), g in zip(named, grads[1:], strict=True)},
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


# --- bytes on the wire ----------------------------------------------------------------------------------


def tlpp_step_bytes(*, batch_size: int, cut_numel: int, node_numel: int, active_nodes: int,
                    elem_bytes: int = 4, label_bytes: int = 8) -> int:
    """Bytes of one base-mode TL++ step (traversal learning's per-step traffic):
    B*a*e up (activations) + B*l up (labels) + B*a*e down (cut gradients)
    + n_a*P_n*e down (node-side weights) + n_a*P_n*e up (node-side gradients),
    with a = cut activation elements per sample, P_n = node-side parameters, n_a = nodes in the
    virtual batch, e = bytes per element, l = bytes per label."""
    return 2 * batch_size * cut_numel * elem_bytes + batch_size * label_bytes \
        + 2 * active_nodes * node_numel * elem_bytes


def tlpp_secure_step_bytes(*, batch_size: int, cut_numel: int, num_classes: int, node_numel: int,
                           server_numel: int, active_nodes: int, elem_bytes: int = 4, label_bytes: int = 8,
                           ring_bytes: int = 8) -> int:
    """Bytes of one secure-mode TL++ step (cut 3 arrangement of ``peer.roles.tlpp.secure``), r = ring
    element bytes, K = classes, P_s = server-side parameters:
    2*B*a*r (activation shares to both servers) + B*l (labels) + B*K*r (helper's logit share)
    + B*K*e (logit-gradient slices down) + n_a*(P_n + P_s)*e (node and server weights down)
    + P_s*e (server weights to the helper) + 2*n_a*(P_n + P_s)*r (gradient shares to both servers)
    + (P_n + P_s)*r (helper's summed gradient share to the orchestrator)."""
    params = node_numel + server_numel
    return (2 * batch_size * cut_numel * ring_bytes + batch_size * label_bytes
            + batch_size * num_classes * (ring_bytes + elem_bytes) + active_nodes * params * elem_bytes
            + server_numel * elem_bytes + 2 * active_nodes * params * ring_bytes + params * ring_bytes)


def full_sync_step_bytes(*, num_nodes: int, model_numel: int, elem_bytes: int = 4) -> int:
    """Bytes of one full-model synchronisation (FedAvg-style): every node downloads and uploads the
    whole model, 2*n*P*e. FedAvg with E local steps per round pays this once per E steps."""
    return 2 * num_nodes * model_numel * elem_bytes

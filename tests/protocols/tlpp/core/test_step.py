"""One TL++ step: the summed split gradient equals centralized autograd, the closed-form logit
gradient, and every bad batch or gradient refused naming what is wrong."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.tlpp.core import (
    TraversalError,
    digits_cnn,
    logit_gradient,
    node_backward,
    node_forward,
    orchestrator_step,
    split_model,
    sum_grads,
)


def _node_data(dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    sizes = {"b": 5, "a": 3, "c": 4}
    xs = {n: torch.rand(k, 1, 8, 8, generator=g, dtype=dtype) for n, k in sizes.items()}
    ys = {n: torch.randint(0, 10, (k,), generator=g) for n, k in sizes.items()}
    return xs, ys


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_split_gradients_equal_centralized_autograd(cut: int) -> None:
    model = digits_cnn(seed=1, dtype=torch.float64)
    reference = copy.deepcopy(model)
    xs, ys = _node_data(torch.float64)
    nodes = sorted(xs)
    loss = F.cross_entropy(reference(torch.cat([xs[n] for n in nodes])), torch.cat([ys[n] for n in nodes]))
    loss.backward()
    expected = {name: p.grad for name, p in reference.named_parameters()}

    node_side, orchestrator_side = split_model(model, cut)
    nodes_copies = {n: copy.deepcopy(node_side) for n in nodes}  # each data node works on its own copy
    step = orchestrator_step(orchestrator_side, {n: node_forward(nodes_copies[n], xs[n]) for n in nodes}, ys)
    node_grads = sum_grads(node_backward(nodes_copies[n], xs[n], step.cut_grads[n]) for n in nodes)

    assert set(node_grads) | set(step.orchestrator_grads) == set(expected)
    assert not set(node_grads) & set(step.orchestrator_grads)
    for name, grad in (node_grads | step.orchestrator_grads).items():
        torch.testing.assert_close(grad, expected[name], rtol=0, atol=1e-10)
    assert step.loss == pytest.approx(float(loss.detach()), abs=1e-12)
    assert step.count == 12 and all(p.grad is None for p in model.parameters())


def test_orchestrator_step_reports_correct_and_slices_in_node_order() -> None:
    top = nn.Sequential(nn.Identity())
    acts = {"b": torch.tensor([[0.0, 5.0]]), "a": torch.tensor([[5.0, 0.0], [5.0, 0.0]])}
    step = orchestrator_step(top, acts, {"a": torch.tensor([0, 1]), "b": torch.tensor([1])})
    assert step.correct == 2 and step.count == 3
    assert [tuple(step.cut_grads[n].shape) for n in ("a", "b")] == [(2, 2), (1, 2)]
    assert step.orchestrator_grads == {}


def test_logit_gradient_matches_autograd() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 10, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 10, (6,), generator=g)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    value, grad, correct = logit_gradient(logits.detach(), labels)
    assert value == pytest.approx(float(loss.detach()), abs=1e-12)
    torch.testing.assert_close(grad, logits.grad, rtol=0, atol=1e-14)
    assert correct == int((logits.argmax(1) == labels).sum())


def _orchestrator_inputs() -> tuple[nn.Module, dict, dict]:
    _, top = split_model(digits_cnn(), 3)
    acts = {"a": torch.rand(2, 64), "b": torch.rand(3, 64)}
    return top, acts, {"a": torch.tensor([1, 2]), "b": torch.tensor([0, 0, 9])}


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda a, y: (a, {**y, "z": torch.tensor([1])}), "nodes without activations"),
    (lambda a, y: ({**a, "z": torch.rand(1, 64)}, y), "activations without labels"),
    (lambda a, y: ({}, {}), "empty"),
    (lambda a, y: ({**a, "b": torch.rand(3, 63)}, y), r"activations\['b'\]: shape"),
    (lambda a, y: ({**a, "b": torch.rand(3, 64, dtype=torch.float64)}, y), r"activations\['b'\]"),
    (lambda a, y: ({**a, "a": torch.ones(2, 64, dtype=torch.int64)}, y), r"activations\['a'\]"),
    (lambda a, y: (a, {**y, "a": torch.tensor([1, 2, 3])}), r"labels\['a'\]: 3 labels for 2"),
    (lambda a, y: (a, {**y, "a": torch.tensor([1.0, 2.0])}), r"labels\['a'\]: need"),
    (lambda a, y: (a, {**y, "a": torch.tensor([1, 10])}), r"\[0, 10\)"),
])
def test_orchestrator_step_refuses_bad_batches(mutate, match: str) -> None:
    top, acts, labels = _orchestrator_inputs()
    acts, labels = mutate(acts, labels)
    with pytest.raises(TraversalError, match=match):
        orchestrator_step(top, acts, labels)


def test_node_backward_refuses_wrong_gradient_shape() -> None:
    node_side, _ = split_model(digits_cnn(), 2)
    x = torch.rand(3, 1, 8, 8)
    with pytest.raises(TraversalError, match="cut_grad: shape"):
        node_backward(node_side, x, torch.zeros(3, 32, 2, 3))


def test_sum_grads_refuses_mismatches() -> None:
    with pytest.raises(TraversalError, match="nothing"):
        sum_grads([])
    with pytest.raises(TraversalError, match="names differ"):
        sum_grads([{"w": torch.zeros(2)}, {"v": torch.zeros(2)}])
    with pytest.raises(TraversalError, match="different shapes"):
        sum_grads([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}])
    assert torch.equal(sum_grads([{"w": torch.ones(2)}, {"w": torch.ones(2)}])["w"], torch.full((2,), 2.0))


def test_logit_gradient_refuses_bad_inputs() -> None:
    with pytest.raises(TraversalError, match="logits"):
        logit_gradient(torch.zeros(3), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TraversalError, match="labels"):
        logit_gradient(torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(TraversalError, match=r"\[0, 4\)"):
        logit_gradient(torch.zeros(2, 4), torch.tensor([0, 4]))

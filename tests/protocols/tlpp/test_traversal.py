"""TL++ traversal: scheduling, the exact split gradient against centralized autograd, refusals."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.errors import ProtocolError
from gossamer.protocols.tlpp import (
    TraversalError,
    VirtualBatch,
    VirtualBatchScheduler,
    affine_server,
    check_node_side,
    digits_cnn,
    full_sync_step_bytes,
    logit_gradient,
    node_backward,
    node_forward,
    server_step,
    split_model,
    sum_grads,
    tlpp_secure_step_bytes,
    tlpp_step_bytes,
)

COUNTS = {"n2": 7, "n0": 5, "n1": 11}

# --- scheduler --------------------------------------------------------------------------------------


def test_scheduler_is_deterministic_per_seed_and_epoch() -> None:
    a = VirtualBatchScheduler(COUNTS, batch_size=4, seed=3)
    b = VirtualBatchScheduler(dict(reversed(COUNTS.items())), batch_size=4, seed=3)
    assert a.epoch(2) == b.epoch(2)
    assert a.epoch(2) != a.epoch(3)
    assert a.epoch(2) != VirtualBatchScheduler(COUNTS, batch_size=4, seed=4).epoch(2)


@pytest.mark.parametrize(("batch_size", "drop_last", "steps"), [(4, False, 6), (4, True, 5), (23, False, 1),
                                                                 (1, False, 23), (30, False, 1)])
def test_every_sample_once_per_epoch(batch_size: int, drop_last: bool, steps: int) -> None:
    scheduler = VirtualBatchScheduler(COUNTS, batch_size=batch_size, seed=0, drop_last=drop_last)
    batches = scheduler.epoch(0)
    seen = [pair for batch in batches for pair in batch.order]
    assert scheduler.steps_per_epoch == len(batches) == steps
    assert len(seen) == len(set(seen))
    everything = {(node, i) for node, count in COUNTS.items() for i in range(count)}
    if drop_last:
        assert set(seen) <= everything and len(seen) == steps * batch_size
    else:
        assert set(seen) == everything
    assert [b.index for b in batches] == list(range(steps)) and {b.epoch for b in batches} == {0}


def test_batches_are_grouped_by_sorted_node_with_split_sizes() -> None:
    for batch in VirtualBatchScheduler(COUNTS, batch_size=9, seed=1).epoch(0):
        nodes = [node for node, _ in batch.order]
        assert nodes == sorted(nodes)
        by_node = batch.by_node()
        assert list(by_node) == sorted(by_node)
        assert batch.sizes() == {node: len(idx) for node, idx in by_node.items()}
        assert sum(batch.sizes().values()) == len(batch.order)
        assert [pair for node in by_node for pair in ((node, i) for i in by_node[node])] == list(batch.order)


def test_virtual_batch_views() -> None:
    batch = VirtualBatch(epoch=0, index=0, order=(("a", 3), ("a", 1), ("b", 0)))
    assert batch.by_node() == {"a": [3, 1], "b": [0]}
    assert batch.sizes() == {"a": 2, "b": 1}


def test_without_drops_nodes_and_keeps_settings() -> None:
    scheduler = VirtualBatchScheduler(COUNTS, batch_size=4, seed=5, drop_last=True)
    rest = scheduler.without(["n1"])
    assert rest.counts == {"n0": 5, "n2": 7}
    assert (rest.batch_size, rest.seed, rest.drop_last) == (4, 5, True)
    assert all(node != "n1" for batch in rest.epoch(0) for node, _ in batch.order)
    with pytest.raises(TraversalError, match="unknown nodes"):
        scheduler.without(["n9"])
    with pytest.raises(TraversalError, match="every node"):
        scheduler.without(COUNTS)


@pytest.mark.parametrize(("counts", "kwargs", "match"), [
    ({}, {}, "counts"),
    ({"a": 0}, {}, r"counts\['a'\]"),
    ({"a": 2.5}, {}, r"counts\['a'\]"),
    ({"": 3}, {}, "node ids"),
    ({"a": 3}, {"batch_size": 0}, "batch_size"),
    ({"a": 3}, {"batch_size": True}, "batch_size"),
    ({"a": 3}, {"seed": -1}, "seed"),
    ({"a": 3}, {"batch_size": 4, "drop_last": True}, "no batch"),
])
def test_scheduler_refuses_bad_settings(counts: dict, kwargs: dict, match: str) -> None:
    settings = {"batch_size": 2, "seed": 0} | kwargs
    with pytest.raises(TraversalError, match=match):
        VirtualBatchScheduler(counts, **settings)


def test_bad_epoch_refused() -> None:
    with pytest.raises(TraversalError, match="epoch"):
        VirtualBatchScheduler(COUNTS, batch_size=2, seed=0).epoch(-1)


# --- exactness ----------------------------------------------------------------------------------------


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

    node_side, server_side = split_model(model, cut)
    nodes_copies = {n: copy.deepcopy(node_side) for n in nodes}  # each data node works on its own copy
    step = server_step(server_side, {n: node_forward(nodes_copies[n], xs[n]) for n in nodes}, ys)
    node_grads = sum_grads(node_backward(nodes_copies[n], xs[n], step.cut_grads[n]) for n in nodes)

    assert set(node_grads) | set(step.server_grads) == set(expected)
    assert not set(node_grads) & set(step.server_grads)
    for name, grad in (node_grads | step.server_grads).items():
        torch.testing.assert_close(grad, expected[name], rtol=0, atol=1e-10)
    assert step.loss == pytest.approx(float(loss.detach()), abs=1e-12)
    assert step.count == 12 and all(p.grad is None for p in model.parameters())


def test_server_step_reports_correct_and_slices_in_node_order() -> None:
    server = nn.Sequential(nn.Identity())
    acts = {"b": torch.tensor([[0.0, 5.0]]), "a": torch.tensor([[5.0, 0.0], [5.0, 0.0]])}
    step = server_step(server, acts, {"a": torch.tensor([0, 1]), "b": torch.tensor([1])})
    assert step.correct == 2 and step.count == 3
    assert [tuple(step.cut_grads[n].shape) for n in ("a", "b")] == [(2, 2), (1, 2)]
    assert step.server_grads == {}


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


# --- refusals -----------------------------------------------------------------------------------------


def test_batchnorm_and_dropout_below_cut_refused() -> None:
    model = nn.Sequential(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)), nn.Sequential(nn.Flatten()))
    with pytest.raises(TraversalError, match="BatchNorm2d"):
        split_model(model, 1)
    with pytest.raises(TraversalError, match="Dropout"):
        check_node_side(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    check_node_side(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0), nn.LayerNorm(2)))
    above = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.BatchNorm1d(2)))
    split_model(above, 1)  # BatchNorm on the server side sees the whole batch: fine


@pytest.mark.parametrize(("cut", "found"), [(1, "Conv2d"), (2, "ReLU")])
def test_affine_server_refuses_non_affine(cut: int, found: str) -> None:
    _, server_side = split_model(digits_cnn(), cut)
    with pytest.raises(TraversalError, match=f"one nn.Linear.*{found}"):
        affine_server(server_side)


def test_affine_server_returns_the_linear() -> None:
    model = digits_cnn()
    _, server_side = split_model(model, 3)
    assert affine_server(server_side) is model[3][0]


@pytest.mark.parametrize("cut", [0, 4, 1.0, True])
def test_split_model_refuses_bad_cut(cut: object) -> None:
    with pytest.raises(TraversalError, match="cut"):
        split_model(digits_cnn(), cut)


def test_split_model_refuses_non_sequential() -> None:
    with pytest.raises(TraversalError, match=r"nn\.Sequential"):
        split_model(nn.Linear(2, 2), 1)


def _server_inputs() -> tuple[nn.Module, dict, dict]:
    _, server = split_model(digits_cnn(), 3)
    acts = {"a": torch.rand(2, 64), "b": torch.rand(3, 64)}
    return server, acts, {"a": torch.tensor([1, 2]), "b": torch.tensor([0, 0, 9])}


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
def test_server_step_refuses_bad_batches(mutate, match: str) -> None:
    server, acts, labels = _server_inputs()
    acts, labels = mutate(acts, labels)
    with pytest.raises(TraversalError, match=match):
        server_step(server, acts, labels)


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


@pytest.mark.parametrize("kwargs", [{"channels": (16, 32)}, {"channels": (16, 0, 32)}, {"hidden": 0},
                                    {"num_classes": 1}, {"seed": -1}])
def test_digits_cnn_refuses_bad_shapes(kwargs: dict) -> None:
    with pytest.raises(TraversalError):
        digits_cnn(**kwargs)


def test_digits_cnn_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, b, c = digits_cnn(seed=4), digits_cnn(seed=4), digits_cnn(seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a[0][0].weight, c[0][0].weight)
    assert a(torch.rand(2, 1, 8, 8)).shape == (2, 10) and len(a) == 4


def test_traversal_error_is_a_protocol_error() -> None:
    assert issubclass(TraversalError, ProtocolError)


# --- byte formulas ----------------------------------------------------------------------------------


def test_byte_formulas() -> None:
    # 2*B*a*e + B*l + 2*n_a*P_n*e with B=10, a=256, P_n=160, n_a=3
    assert tlpp_step_bytes(batch_size=10, cut_numel=256, node_numel=160, active_nodes=3) == \
        2 * 10 * 256 * 4 + 10 * 8 + 2 * 3 * 160 * 4
    assert full_sync_step_bytes(num_nodes=10, model_numel=1000) == 80_000
    secure = tlpp_secure_step_bytes(batch_size=2, cut_numel=3, num_classes=4, node_numel=5, server_numel=6,
                                    active_nodes=1)
    assert secure == 2 * 2 * 3 * 8 + 2 * 8 + 2 * 4 * 12 + 11 * 4 + 6 * 4 + 2 * 11 * 8 + 11 * 8

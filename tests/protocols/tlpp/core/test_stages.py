"""Declared stages: the vocabulary parsed and refused naming the layer, shapes inferred without
building, the built-ins as declarations, secure mode's rule naming the stage, seeded building,
and TL++ base mode on a declared 28x28 stack equal to centralized training in float64."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gossamer.protocols.tlpp.core import (
    BUILTINS,
    TraversalError,
    VirtualBatchScheduler,
    build_stages,
    builtin_stages,
    check_secure,
    digits_cnn,
    infer_shapes,
    node_backward,
    node_forward,
    orchestrator_step,
    split_model,
    sum_grads,
)
from gossamer.protocols.tlpp.core.stages import ResidualBlock, parse_layer

FASHION_CNN = (("conv 16", "relu", "maxpool 2"), ("conv 32", "relu", "maxpool 2"),
               ("flatten", "linear 64", "relu"), ("linear 10",))


def test_shapes_are_inferred_stage_by_stage() -> None:
    assert infer_shapes(FASHION_CNN, input_shape=(1, 28, 28), num_classes=10) == [
        (16, 14, 14), (32, 7, 7), (64,), (10,)]
    stages = (("conv 8 5 stride=2 pad=0", "avgpool 2"), ("residual 16 stride=2", "globalpool"), ("linear 3",))
    assert infer_shapes(stages, input_shape=(3, 32, 32), num_classes=3) == [(8, 7, 7), (16,), (3,)]
    assert infer_shapes((("linear 5", "silu"), ("linear 2",)), input_shape=(12,), num_classes=2) == [(5,), (2,)]


@pytest.mark.parametrize(("spec", "problem"), [
    ("", "non-empty string"), (3, "non-empty string"), ("pool 2", "unknown layer 'pool'"),
    ("conv", "conv takes 1 to 2 size"), ("conv 8 3 3", "conv takes 1 to 2 size"), ("relu 2", "relu takes 0 size"),
    ("conv 8 stride=0", r"sizes must lie in \[1, 65536\]"), ("conv 8 stride=2 3", "before key=value options"),
    ("conv 8 dilation=2", "conv takes no option 'dilation' \\(it takes stride, pad\\)"),
    ("linear 0", r"sizes must lie in \[1"), ("linear -3", "cannot read '-3'"), ("maxpool 2 stride=1", "takes no option"),
])
def test_bad_layer_specs_are_refused_naming_the_layer(spec: object, problem: str) -> None:
    with pytest.raises(TraversalError, match=f"stages\\[1\\]\\[2\\].*{problem}"):
        parse_layer(spec, "stages[1][2]")


@pytest.mark.parametrize(("stages", "input_shape", "problem"), [
    ((("conv 8",), ("linear 10",)), (1, 8, 8), r"stages\[1\]\[0\] 'linear 10': needs a flat input \[F\], got \[8, 8, 8\]"),
    ((("flatten",), ("flatten", "linear 10")), (1, 8, 8), r"stages\[1\]\[0\] 'flatten': the input \[64\] is already flat"),
    ((("maxpool 2",), ("maxpool 2",), ("flatten", "linear 10")), (1, 3, 3), r"stages\[1\]\[0\] 'maxpool 2': kernel 2"),
    ((("conv 4",), ("flatten", "linear 10")), (20,), r"stages\[0\]\[0\] 'conv 4': needs an image input"),
    ((("flatten", "linear 9"),), (1, 4, 4), "at least 2 stages"),
    ((("flatten",), ()), (1, 4, 4), r"stages\[1\]: a stage is a non-empty list"),
    ((("flatten",), ("linear 9",)), (1, 4, 4), r"stages\[1\]: the stack ends in \[9\], not the \[10\] logits"),
    ((("flatten",), ("linear 10",)), (1, 4), r"input_shape: need \[F\] \(tabular\) or \[C, H, W\]"),
])
def test_declarations_that_do_not_fit_are_refused_naming_the_layer(stages, input_shape, problem: str) -> None:
    with pytest.raises(TraversalError, match=problem):
        infer_shapes(stages, input_shape=input_shape, num_classes=10)
    with pytest.raises(TraversalError, match=problem):
        build_stages(stages, input_shape=input_shape, num_classes=10)


def test_secure_mode_takes_one_linear_layer_above_the_cut_and_names_the_stage_that_breaks_it() -> None:
    check_secure(FASHION_CNN, 3)
    with pytest.raises(TraversalError, match=r"stages\[2\] \('flatten', 'linear 64', 'relu'\) is above the cut \(2\) "
                                             "and 'flatten' is not affine"):
        check_secure(FASHION_CNN, 2)
    with pytest.raises(TraversalError, match=r"stages\[2\] \('linear 10'\).*second 'linear'"):
        check_secure((("flatten",), ("linear 5",), ("linear 10",)), 1)
    with pytest.raises(TraversalError, match=r"cut: must be an int in \[1, 3\]"):
        check_secure(FASHION_CNN, 4)


def test_builtins_are_declarations_and_digits_cnn_is_one_of_them() -> None:
    assert set(BUILTINS) == {"digits_cnn", "rgb_cnn", "tabular_mlp", "resnet_small"}
    a = digits_cnn(seed=7)
    b = build_stages(builtin_stages("digits_cnn", num_classes=10), input_shape=(1, 8, 8), num_classes=10, seed=7)
    assert list(a.state_dict()) == list(b.state_dict()) and all(
        torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert digits_cnn(input_shape=(1, 28, 28))(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(TraversalError, match="unknown built-in model 'vgg'"):
        builtin_stages("vgg", num_classes=10)
    with pytest.raises(TraversalError, match="rgb_cnn takes 2 conv widths"):
        builtin_stages("rgb_cnn", num_classes=10, channels=(8, 8, 8))
    with pytest.raises(TraversalError, match="tabular_mlp has no conv layers"):
        builtin_stages("tabular_mlp", num_classes=10, channels=(8,))


def test_building_is_seeded_never_global_and_residual_blocks_start_as_the_identity_branch() -> None:
    stages = (("conv 4", "relu", "residual 4"), ("residual 8 stride=2", "globalpool"), ("linear 3",))
    state = torch.random.get_rng_state()
    a = build_stages(stages, input_shape=(2, 8, 8), num_classes=3, seed=1)
    b = build_stages(stages, input_shape=(2, 8, 8), num_classes=3, seed=1, dtype=torch.float64)
    c = build_stages(stages, input_shape=(2, 8, 8), num_classes=3, seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q.float()) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a[0][0].weight, c[0][0].weight)
    same, projected = a[0][2], a[1][0]
    assert isinstance(same, ResidualBlock) and isinstance(same.skip, nn.Identity) and isinstance(projected.skip, nn.Conv2d)
    assert int(torch.count_nonzero(same.conv2.weight)) == 0 and int(torch.count_nonzero(same.conv1.weight)) > 0
    x = torch.rand(3, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(same(x), torch.relu(x))  # the zero branch: the block starts as relu(skip(x))


def test_tlpp_base_on_a_declared_28x28_stack_is_centralized_training_in_float64() -> None:
    """The exactness check the experiments' float32 caveat rests on: a few Adam steps of TL++ base
    (each node on its own copy of the node side, gradients summed) equal centralized training on
    the same virtual batches to 1e-10 in float64, for a declared 28x28 stack with a residual block."""
    stages = (("conv 4", "relu", "maxpool 2"), ("residual 8 stride=2", "gelu"), ("flatten", "linear 16", "tanh"),
              ("linear 10",))
    g = torch.Generator().manual_seed(0)
    xs = {f"node{k}": torch.rand(6, 1, 28, 28, generator=g, dtype=torch.float64) for k in range(3)}
    ys = {n: torch.full((6,), k) for k, n in enumerate(xs)}  # one class per node
    reference = build_stages(stages, input_shape=(1, 28, 28), num_classes=10, seed=3, dtype=torch.float64)
    model = copy.deepcopy(reference)
    node_side, orchestrator_side = split_model(model, 2)
    local = {n: copy.deepcopy(node_side) for n in xs}
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=1e-2), torch.optim.Adam(reference.parameters(), lr=1e-2)
    scheduler = VirtualBatchScheduler({n: 6 for n in xs}, batch_size=5, seed=0, drop_last=True)
    for batch in scheduler.epoch(0) + scheduler.epoch(1):
        by_node = batch.by_node()
        bx, by = {n: xs[n][i] for n, i in by_node.items()}, {n: ys[n][i] for n, i in by_node.items()}
        for n in bx:
            local[n].load_state_dict(node_side.state_dict())
        step = orchestrator_step(orchestrator_side, {n: node_forward(local[n], bx[n]) for n in bx}, by)
        grads = sum_grads(node_backward(local[n], bx[n], step.cut_grads[n]) for n in bx) | step.orchestrator_grads
        for name, p in model.named_parameters():
            p.grad = grads[name]
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(reference(torch.cat([bx[n] for n in sorted(bx)])), torch.cat([by[n] for n in sorted(by)])).backward()
        ref_opt.step()
    assert len(scheduler.epoch(0)) * 2 == 6
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-10, msg=name)

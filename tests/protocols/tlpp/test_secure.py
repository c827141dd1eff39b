"""TL++ secure mode against the base (plaintext) path, the parties' separation, and refusals."""

from __future__ import annotations

import pytest
import torch

from gossamer.crypto.sharing import MaskStream, SharingError, encode, share_float
from gossamer.protocols.tlpp.core import (
    TraversalError,
    digits_cnn,
    node_backward,
    node_forward,
    orchestrator_step,
    split_model,
    sum_grads,
    tlpp_secure_step_bytes,
)
from gossamer.protocols.tlpp.core.secure import (
    HELPER,
    ORCHESTRATOR,
    PartyShare,
    flatten_grads,
    gradient_layout,
    logit_bound,
    node_gradient_shares,
    node_share_activations,
    orchestrator_gradients,
    orchestrator_logit_gradients,
    party_logit_share,
    party_sum,
    secure_step,
    unflatten_grads,
)

MAX_ABS = 8.0


def _batch(sizes: dict[str, int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    xs = {n: torch.rand(k, 1, 8, 8, generator=g) for n, k in sizes.items()}
    return xs, {n: torch.randint(0, 10, (k,), generator=g) for n, k in sizes.items()}


def _masks(nodes, seed: int = 0) -> dict[str, MaskStream]:
    return {n: MaskStream(key=bytes([seed, i]) * 16) for i, n in enumerate(sorted(nodes))}


def _base(node_side, orchestrator_side, xs, ys) -> tuple[object, dict[str, torch.Tensor]]:
    step = orchestrator_step(orchestrator_side, {n: node_forward(node_side, xs[n]) for n in xs}, ys)
    grads = sum_grads(node_backward(node_side, xs[n], step.cut_grads[n]) for n in sorted(xs))
    return step, grads | step.orchestrator_grads


def test_secure_step_matches_base_mode_within_fixed_point_error() -> None:
    model = digits_cnn(seed=3)
    node_side, orchestrator_side = split_model(model, 3)
    xs, ys = _batch({"c": 4, "a": 6, "b": 5})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    base, base_grads = _base(node_side, orchestrator_side, xs, ys)

    secure = secure_step(node_side, orchestrator_side, xs, ys, max_abs=MAX_ABS, max_failure=1e-4, masks=_masks(xs))

    plain_logits = orchestrator_side(torch.cat([node_forward(node_side, xs[n]) for n in sorted(xs)]))
    torch.testing.assert_close(secure.logits, plain_logits.detach().double(), rtol=0, atol=1e-3)
    assert secure.loss == pytest.approx(base.loss, abs=1e-4)
    assert (secure.correct, secure.count) == (base.correct, base.count)
    assert set(secure.grads) == set(base_grads) == {n for n, _ in model.named_parameters()}
    for name, grad in base_grads.items():
        torch.testing.assert_close(secure.grads[name], grad, rtol=0, atol=2e-5)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_secure_bytes_match_the_formula() -> None:
    model = digits_cnn(seed=0)
    node_side, orchestrator_side = split_model(model, 3)
    xs, ys = _batch({"a": 3, "b": 4})
    step = secure_step(node_side, orchestrator_side, xs, ys, max_abs=MAX_ABS, max_failure=1e-4)
    node_numel = sum(p.numel() for p in node_side.parameters())
    orchestrator_numel = sum(p.numel() for p in orchestrator_side.parameters())
    assert step.ledger.total_bytes == tlpp_secure_step_bytes(
        batch_size=7, cut_numel=64, num_classes=10, node_numel=node_numel, orchestrator_numel=orchestrator_numel,
        active_nodes=2)
    assert set(step.ledger.links) >= {("a", "helper"), ("helper", "orchestrator"), ("orchestrator", "b")}


def test_single_node_batch_reveals_that_nodes_gradient() -> None:
    node_side, orchestrator_side = split_model(digits_cnn(seed=1), 3)
    xs, ys = _batch({"only": 5})
    _, base_grads = _base(node_side, orchestrator_side, xs, ys)
    secure = secure_step(node_side, orchestrator_side, xs, ys, max_abs=MAX_ABS, max_failure=1e-4)
    # the "sum" has one term: the orchestrator sees node "only"'s own gradient
    for name, grad in base_grads.items():
        torch.testing.assert_close(secure.grads[name], grad, rtol=0, atol=2e-5)


# --- what the helper receives is independent of the data ---------------------------------------------------


def test_helper_inputs_do_not_depend_on_the_data() -> None:
    node_side, orchestrator_side = split_model(digits_cnn(seed=2), 3)
    x1, x2 = torch.rand(4, 1, 8, 8), torch.zeros(4, 1, 8, 8)
    a1, a2 = node_forward(node_side, x1), node_forward(node_side, x2)
    assert not torch.equal(a1, a2)
    o1, h1 = node_share_activations(node_side, x1, max_abs=MAX_ABS, masks=MaskStream(key=bytes(32)))
    o2, h2 = node_share_activations(node_side, x2, max_abs=MAX_ABS, masks=MaskStream(key=bytes(32)))
    assert (o1.party, h1.party) == (ORCHESTRATOR, HELPER)
    assert torch.equal(h1.ring, h2.ring)  # same masks: the helper's share is identical for different data
    assert torch.equal(o1.ring - o2.ring, encode(a1) - encode(a2))  # the data only moves party 0's share
    logit_1 = party_logit_share({"n": h1}, orchestrator_side, max_abs=MAX_ABS, max_failure=1e-4)
    logit_2 = party_logit_share({"n": h2}, orchestrator_side, max_abs=MAX_ABS, max_failure=1e-4)
    assert torch.equal(logit_1.ring, logit_2.ring)

    g1, g2 = torch.rand(4, 10) - 0.5, torch.rand(4, 10) - 0.5
    _, gh1 = node_gradient_shares(node_side, orchestrator_side, x1, g1, masks=MaskStream(key=bytes(32)))
    _, gh2 = node_gradient_shares(node_side, orchestrator_side, x2, g2, masks=MaskStream(key=bytes(32)))
    assert torch.equal(gh1.ring, gh2.ring)


def test_single_shares_look_uniform() -> None:
    a = torch.full((64, 64), 3.25)  # a constant secret: any structure in a share would show
    s0, s1 = share_float(a, MaskStream())
    for share in (s0, s1):
        bits = torch.stack([(share >> k) & 1 for k in range(64)]).double()
        assert bits.mean(dim=(1, 2)).sub(0.5).abs().max() < 0.05  # 4096 draws per bit: SD 0.0078
        assert share.unique().numel() == share.numel()


# --- a party never takes both shares; orchestrator's reconstructions check the parties ---------------------


def test_each_party_refuses_shares_of_two_parties() -> None:
    node_side, orchestrator_side = split_model(digits_cnn(), 3)
    x = torch.rand(2, 1, 8, 8)
    o, h = node_share_activations(node_side, x, max_abs=MAX_ABS, masks=MaskStream())
    with pytest.raises(SharingError, match="parties"):
        party_logit_share({"a": o, "b": h}, orchestrator_side, max_abs=MAX_ABS, max_failure=1e-4)
    go, gh = node_gradient_shares(node_side, orchestrator_side, x, torch.zeros(2, 10), masks=MaskStream())
    layout = gradient_layout(node_side, orchestrator_side)
    with pytest.raises(SharingError, match="parties"):
        party_sum([go, gh])
    with pytest.raises(SharingError, match="shape"):
        party_sum([go, PartyShare(ORCHESTRATOR, go.ring[:-1])])
    with pytest.raises(SharingError, match="parties 1 and 0"):
        orchestrator_logit_gradients(h, o, {"a": torch.tensor([0, 1])}, bound=1e9)
    with pytest.raises(SharingError, match="parties"):
        orchestrator_gradients(gh, go, layout=layout)
    with pytest.raises(SharingError, match="expected"):
        orchestrator_gradients(PartyShare(ORCHESTRATOR, go.ring[:-1]), PartyShare(HELPER, gh.ring[:-1]),
                               layout=layout)


def test_party_sums_reconstruct_only_the_sum() -> None:
    node_side, orchestrator_side = split_model(digits_cnn(seed=4), 3)
    xs, _ = _batch({"a": 3, "b": 2})
    gs = {"a": torch.rand(3, 10), "b": torch.rand(2, 10)}
    pairs = [node_gradient_shares(node_side, orchestrator_side, xs[n], gs[n], masks=MaskStream()) for n in xs]
    total = orchestrator_gradients(party_sum([p[0] for p in pairs]), party_sum([p[1] for p in pairs]),
                                   layout=gradient_layout(node_side, orchestrator_side))
    expected = (gs["a"].sum(0) + gs["b"].sum(0)).double()
    torch.testing.assert_close(total["3.0.bias"], expected, rtol=0, atol=1e-4)


def test_gradients_travel_as_one_flat_vector_in_sorted_name_order() -> None:
    model = digits_cnn(seed=5)
    node_side, orchestrator_side = split_model(model, 3)
    layout = gradient_layout(node_side, orchestrator_side)
    assert [name for name, _ in layout] == sorted(n for n, _ in model.named_parameters())
    grads = {name: torch.rand(shape) for name, shape in layout}
    flat = flatten_grads(grads, layout)
    assert flat.shape == (sum(p.numel() for p in model.parameters()),)
    back = unflatten_grads(flat, layout)
    assert all(torch.equal(back[name], grads[name]) for name in grads)
    with pytest.raises(SharingError, match="do not match the layout"):
        flatten_grads({k: v for k, v in grads.items() if k != "3.0.bias"}, layout)
    with pytest.raises(SharingError, match=r"'3\.0\.bias' is"):
        flatten_grads({**grads, "3.0.bias": torch.zeros(3)}, layout)
    with pytest.raises(SharingError, match="unflatten_grads"):
        unflatten_grads(flat[1:], layout)
    x, g = torch.rand(3, 1, 8, 8), torch.rand(3, 10) - 0.5
    own, theirs = node_gradient_shares(node_side, orchestrator_side, x, g, masks=MaskStream())
    assert own.ring.shape == theirs.ring.shape == flat.shape and own.ring.dtype == torch.int64


# --- guards and refusals ------------------------------------------------------------------------------------


def test_magnitude_guard_refuses() -> None:
    node_side, orchestrator_side = split_model(digits_cnn(), 3)
    x = torch.rand(3, 1, 8, 8) * 1e4
    with pytest.raises(SharingError, match="max_abs"):
        node_share_activations(node_side, x, max_abs=0.5, masks=MaskStream())
    o, _ = node_share_activations(node_side, torch.rand(3, 1, 8, 8), max_abs=MAX_ABS, masks=MaskStream())
    with pytest.raises(SharingError, match="truncation refused"):
        party_logit_share({"a": o}, orchestrator_side, max_abs=2.0 ** 20, max_failure=1e-6)


def test_failed_truncation_is_detected_not_applied() -> None:
    _, orchestrator_side = split_model(digits_cnn(), 3)
    bound = logit_bound(orchestrator_side, max_abs=MAX_ABS)
    garbage = PartyShare(ORCHESTRATOR, encode(torch.full((2, 10), 2.0 ** 40)))
    zero = PartyShare(HELPER, torch.zeros(2, 10, dtype=torch.int64))
    with pytest.raises(SharingError, match="truncation failure"):
        orchestrator_logit_gradients(garbage, zero, {"a": torch.tensor([0, 1])}, bound=bound)


def test_non_affine_orchestrator_side_refused() -> None:
    node_side, orchestrator_side = split_model(digits_cnn(), 2)
    xs, ys = _batch({"a": 2})
    with pytest.raises(TraversalError, match=r"one nn\.Linear"):
        secure_step(node_side, orchestrator_side, xs, ys, max_abs=MAX_ABS)
    o, _ = node_share_activations(node_side, xs["a"], max_abs=64.0, masks=MaskStream())
    with pytest.raises(TraversalError, match=r"one nn\.Linear"):
        party_logit_share({"a": o}, orchestrator_side, max_abs=64.0, max_failure=1e-4)


def test_secure_step_refuses_mismatched_nodes() -> None:
    node_side, orchestrator_side = split_model(digits_cnn(), 3)
    xs, ys = _batch({"a": 2})
    with pytest.raises(SharingError, match="must match"):
        secure_step(node_side, orchestrator_side, xs, {"b": ys["a"]}, max_abs=MAX_ABS)

"""The MoE LM: config, names, init, routing against a compute-everything reference, skip-token
savings counted in expert calls and in FLOPs, the load-balancing loss, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig, build_model
from gossamer.protocols.fomoe.core import MoEConfig, MoETransformer, ParamLayout, build_moe_model, expert_of
from gossamer.protocols.fomoe.core.layer import MixtureOfExperts
from tests.protocols.fomoe.core.conftest import TINY, tokens


@pytest.mark.parametrize(("overrides", "field"), [
    ({"n_experts": 0}, "n_experts"), ({"top_k": 0}, "top_k"), ({"top_k": 5, "n_experts": 4}, "top_k"),
    ({"n_experts": True}, "n_experts"), ({"d_model": 30}, "d_model"),
])
def test_config_refuses_bad_field_and_names_it(overrides: dict, field: str) -> None:
    with pytest.raises(InvalidSetting, match=field):
        MoEConfig(**overrides)


def test_config_reads_a_manifest_table_and_refuses_unknown_keys() -> None:
    config = MoEConfig.from_dict({"d_model": 64, "n_experts": 16, "top_k": 1})

    assert (config.d_model, config.n_experts, config.top_k) == (64, 16, 1)
    assert MoEConfig.from_dict(config.to_dict()) == config
    with pytest.raises(InvalidSetting, match="n_expert"):
        MoEConfig.from_dict({"n_expert": 4})
    with pytest.raises(InvalidSetting, match="MoEConfig"):
        MoETransformer(ModelConfig())


def test_names_keep_the_byte_transformer_scheme_with_experts_under_mlp() -> None:
    dense = {n for n, _ in build_model(ModelConfig(d_model=32, n_layers=2, n_heads=4, context=16), seed=0)
             .named_parameters()}
    moe = dict(build_moe_model(TINY, seed=0).named_parameters())

    assert {n for n in dense if ".mlp." not in n} == {n for n in moe if ".mlp." not in n}
    assert "blocks.1.mlp.router.weight" in moe
    assert moe["blocks.1.mlp.router.weight"].shape == (4, 32)
    assert moe["blocks.0.mlp.experts.3.fc.weight"].shape == (64, 32)
    assert expert_of("blocks.0.mlp.experts.3.proj.bias") == (0, 3)
    assert expert_of("blocks.0.mlp.router.weight") is None
    layout = ParamLayout.of(build_moe_model(TINY, seed=0))
    assert sorted(layout.units) == [(b, e) for b in range(2) for e in range(4)]
    assert layout.dense_bytes + sum(layout.expert_bytes(e) for e in range(4)) == layout.total_bytes


def test_same_seed_same_parameters_and_the_global_rng_is_untouched() -> None:
    state = torch.random.get_rng_state()
    a, b, c = (build_moe_model(TINY, seed=s) for s in (3, 3, 4))

    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if name.endswith("weight") and pa.dim() == 2:
            assert not torch.equal(pa, pc), name


@torch.no_grad()
def reference_moe(layer: MixtureOfExperts, x: torch.Tensor, resident: set[int], renormalize: bool) -> torch.Tensor:
    """Every expert on every token, then masked: the naive definition the layer must match."""
    flat = x.reshape(-1, x.shape[-1])
    probs = F.softmax(layer.router(flat).float(), dim=-1)
    gates, chosen = probs.topk(layer.top_k, dim=-1)
    out = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        kept = [j for j in range(layer.top_k) if int(chosen[n, j]) in resident]
        scale = float(gates[n].sum() / gates[n, kept].sum()) if renormalize and kept else 1.0
        for j in kept:
            out[n] += scale * float(gates[n, j]) * layer.experts[int(chosen[n, j])](flat[n:n + 1])[0]
    return out.view_as(x)


@pytest.mark.parametrize("resident", [{0, 1, 2, 3}, {1, 3}, {2}, set()])
@pytest.mark.parametrize("renormalize", [False, True])
def test_layer_equals_compute_everything_then_mask(resident: set[int], renormalize: bool) -> None:
    layer = build_moe_model(TINY, seed=1).blocks[0].mlp
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([e in resident for e in range(4)])

    with torch.no_grad():
        out, routing = layer(x, resident=mask, renormalize=renormalize)

    torch.testing.assert_close(out, reference_moe(layer, x, resident, renormalize), rtol=1e-5, atol=1e-6)
    assert int(routing.routed.sum()) == 15 * 2
    assert routing.computed.tolist() == [int(c) if e in resident else 0 for e, c in enumerate(routing.routed)]


def test_no_resident_pair_is_skipped_when_every_expert_is_held() -> None:
    model = build_moe_model(TINY, seed=2)
    x = tokens(2, 16, seed=1)

    logits, routing = model.forward_routed(x, resident=range(4))

    assert torch.equal(logits, model(x))
    assert torch.equal(routing.routed, routing.computed)
    assert routing.skip_fraction == 0.0


def expert_rows(model: MoETransformer, x: torch.Tensor, resident: set[int]) -> tuple[dict, torch.Tensor]:
    """Rows each expert's first linear map really received, counted with forward hooks."""
    rows: dict[tuple[int, int], list[int]] = {}
    hooks = []
    for b, block in enumerate(model.blocks):
        for e, expert in enumerate(block.mlp.experts):
            hooks.append(expert.fc.register_forward_hook(
                lambda _m, args, _out, key=(b, e): rows.setdefault(key, []).append(args[0].shape[0])))
    try:
        _, routing = model.forward_routed(x, resident=resident)
    finally:
        for hook in hooks:
            hook.remove()
    return rows, routing.computed


def test_skipped_pairs_never_reach_an_expert() -> None:
    model = build_moe_model(TINY, seed=3)
    x = tokens(4, 16, seed=2)

    rows, computed = expert_rows(model, x, resident={1, 2})

    assert {e for _, e in rows} <= {1, 2}
    assert all(len(calls) == 1 for calls in rows.values())  # one call per expert and block
    for (b, e), calls in rows.items():
        assert calls[0] == int(computed[b, e])
    assert sum(sum(c) for c in rows.values()) == int(computed.sum())


def flops(model: MoETransformer, x: torch.Tensor, resident: set[int]) -> tuple[int, int, int]:
    """(forward FLOPs, backward FLOPs, pairs computed) counted by torch's FLOP counter."""
    with FlopCounterMode(display=False) as forward:
        logits, routing = model.forward_routed(x, resident=resident)
    loss = logits.float().square().mean()
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return forward.get_total_flops(), backward.get_total_flops(), int(routing.computed.sum())


def test_skipped_pairs_cost_no_expert_flops_forward_or_backward() -> None:
    model = build_moe_model(TINY, seed=4)
    x = tokens(4, 16, seed=3)
    d, h = TINY.d_model, TINY.mlp_ratio * TINY.d_model
    per_pair = 2 * (d * h + h * d)  # the expert's two matmuls, 2 FLOPs per multiply-add

    full_fwd, full_bwd, full_pairs = flops(model, x, set(range(4)))
    part_fwd, part_bwd, part_pairs = flops(model, x, {0})

    assert part_pairs < full_pairs
    assert full_fwd - part_fwd == (full_pairs - part_pairs) * per_pair
    assert full_bwd - part_bwd == 2 * (full_pairs - part_pairs) * per_pair


def test_only_resident_experts_and_all_dense_parameters_get_gradients() -> None:
    model = build_moe_model(TINY, seed=5)
    logits, routing = model.forward_routed(tokens(2, 16, seed=4), resident={0, 3})

    (logits.float().logsumexp(-1).mean() + routing.aux_loss).backward()

    for name, param in model.named_parameters():
        key = expert_of(name)
        if key is None or key[1] in (0, 3):
            assert param.grad is not None and bool(param.grad.abs().sum() > 0), name
        else:
            assert param.grad is None, name


def test_load_balancing_loss_is_switch_formula_on_the_full_distribution() -> None:
    layer = build_moe_model(TINY, seed=6).blocks[1].mlp
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(5))
    probs = F.softmax(layer.router(x), dim=-1)
    chosen = probs.topk(2, dim=-1).indices
    fraction = torch.stack([(chosen == e).sum() for e in range(4)]).float() / chosen.numel()
    expected = 4 * (fraction * probs.mean(0)).sum()

    _, with_all = layer(x)
    _, with_one = layer(x, resident=torch.tensor([True, False, False, False]))

    torch.testing.assert_close(with_all.aux_loss, expected)
    torch.testing.assert_close(with_one.aux_loss, expected)  # skipping does not change it


def test_resident_indices_are_checked() -> None:
    model = build_moe_model(TINY, seed=0)
    with pytest.raises(InvalidSetting, match="resident"):
        model(tokens(1, 4, seed=0), resident=[4])

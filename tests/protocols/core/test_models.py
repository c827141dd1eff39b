"""ByteTransformer: config validation, deterministic init, causality, tying, groups, generation."""

from __future__ import annotations

import math

import pytest
import torch

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import (
    ByteTransformer,
    ModelConfig,
    build_model,
    flat_parameters,
    generate,
    load_parameters,
    parameter_groups,
)

TINY = ModelConfig(d_model=32, n_layers=2, n_heads=4, context=16)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 30, "n_heads": 4}, "d_model"),
        ({"n_layers": 0}, "n_layers"),
        ({"context": -1}, "context"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"mlp_ratio": 2.5}, "mlp_ratio"),
        ({"dropout": 1.0}, "dropout"),
        ({"n_heads": True}, "n_heads"),
        ({"tie_embeddings": "yes"}, "tie_embeddings"),
    ],
)
def test_config_refuses_bad_field_and_names_it(overrides: dict, field: str) -> None:
    with pytest.raises(InvalidSetting, match=field):
        ModelConfig(**overrides)


def test_config_from_dict_accepts_subset_and_refuses_unknown_keys() -> None:
    config = ModelConfig.from_dict({"d_model": 64, "context": 32, "dropout": 0})

    assert (config.d_model, config.context, config.n_layers, config.dropout) == (64, 32, 2, 0.0)
    assert ModelConfig.from_dict(config.to_dict()) == config
    with pytest.raises(InvalidSetting, match="d_modle"):
        ModelConfig.from_dict({"d_modle": 64})


def test_same_seed_gives_bitwise_same_parameters_and_leaves_global_rng_alone() -> None:
    rng_before = torch.random.get_rng_state()

    first, second = build_model(TINY, seed=7), build_model(TINY, seed=7)
    other = build_model(TINY, seed=8)

    assert torch.equal(torch.random.get_rng_state(), rng_before)
    a, b, c = flat_parameters(first), flat_parameters(second), flat_parameters(other)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_init_is_gpt2_style() -> None:
    config = ModelConfig(d_model=128, n_layers=4, n_heads=4, context=16)

    params = flat_parameters(build_model(config, seed=0))

    assert params["embed.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    residual_std = 0.02 / math.sqrt(2 * config.n_layers)
    assert params["blocks.0.mlp.proj.weight"].std().item() == pytest.approx(residual_std, rel=0.05)
    assert params["blocks.1.attn.proj.weight"].std().item() == pytest.approx(residual_std, rel=0.05)
    assert torch.equal(params["norm_f.weight"], torch.ones(128))
    assert torch.equal(params["blocks.0.attn.qkv.bias"], torch.zeros(3 * 128))


def test_forward_shape_and_context_limit() -> None:
    model = build_model(TINY, seed=0)
    tokens = torch.randint(0, 256, (3, TINY.context), generator=torch.Generator().manual_seed(0))

    logits = model(tokens)

    assert logits.shape == (3, TINY.context, 256)
    assert model(tokens[:, :5]).shape == (3, 5, 256)
    with pytest.raises(InvalidSetting, match="context"):
        model(torch.zeros(1, TINY.context + 1, dtype=torch.long))


def test_future_bytes_do_not_change_earlier_logits() -> None:
    model = build_model(TINY, seed=0)
    tokens = torch.randint(0, 256, (2, TINY.context), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256

    before, after = model(tokens), model(changed)

    torch.testing.assert_close(after[:, :10], before[:, :10], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, 10:], before[:, 10:])


def test_tied_head_has_no_separate_parameter() -> None:
    tied = build_model(TINY, seed=0)
    untied = build_model(ModelConfig(**{**TINY.to_dict(), "tie_embeddings": False}), seed=0)
    tokens = torch.arange(8).unsqueeze(0)

    names = set(flat_parameters(tied))
    with torch.no_grad():
        tied.embed.weight[:, 0] += 1.0  # the head reads the same matrix

    assert "head.weight" not in names and "head.weight" in flat_parameters(untied)
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 256 * 32
    hidden = tied.norm_f(tied.blocks[1](tied.blocks[0](tied.embed(tokens) + tied.pos(torch.arange(8)))))
    torch.testing.assert_close(tied(tokens), hidden @ tied.embed.weight.T)


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_groups_cover_every_parameter_exactly_once(tie: bool) -> None:
    model = build_model(ModelConfig(d_model=32, n_layers=3, n_heads=2, context=8, tie_embeddings=tie), seed=0)

    groups = parameter_groups(model)

    assert list(groups) == ["embeddings", "layer0", "layer1", "layer2", "head"]
    listed = [name for names in groups.values() for name in names]
    assert sorted(listed) == sorted(name for name, _ in model.named_parameters())
    assert len(listed) == len(set(listed))
    assert groups["embeddings"] == ["embed.weight", "pos.weight"]
    assert all(name.startswith("blocks.1.") for name in groups["layer1"])
    assert ("head.weight" in groups["head"]) is not tie and "norm_f.weight" in groups["head"]


def test_load_parameters_round_trips_and_flat_parameters_are_copies() -> None:
    source, target = build_model(TINY, seed=1), build_model(TINY, seed=2)
    params = flat_parameters(source)

    load_parameters(target, params)
    params["embed.weight"].zero_()

    assert all(torch.equal(a, b) for a, b in zip(source.parameters(), target.parameters(), strict=True))
    assert source.embed.weight.abs().sum() > 0


@pytest.mark.parametrize("damage", ["missing", "extra", "shape"])
def test_load_parameters_is_strict(damage: str) -> None:
    model = build_model(TINY, seed=0)
    params = flat_parameters(model)
    if damage == "missing":
        del params["pos.weight"]
    elif damage == "extra":
        params["head.weight"] = torch.zeros(256, 32)
    else:
        params["pos.weight"] = torch.zeros(TINY.context + 1, 32)

    with pytest.raises(InvalidSetting, match=r"pos\.weight|head\.weight"):
        load_parameters(model, params)


def test_generate_is_deterministic_with_a_seeded_generator_and_slides_past_context() -> None:
    model = build_model(TINY, seed=0)
    prompt = b"x" * (TINY.context + 5)

    first = generate(model, prompt, max_new_bytes=20, generator=torch.Generator().manual_seed(3))
    second = generate(model, prompt, max_new_bytes=20, generator=torch.Generator().manual_seed(3))
    greedy = generate(model, prompt, max_new_bytes=20, temperature=0.0)

    assert len(first) == 20 and first == second
    assert greedy == generate(model, prompt, max_new_bytes=20, temperature=0.0)
    assert generate(model, b"a", max_new_bytes=0, temperature=0.0) == b""


def test_generate_refuses_sampling_without_a_generator_and_keeps_training_mode() -> None:
    model = build_model(TINY, seed=0)
    model.train()

    generate(model, b"ab", max_new_bytes=2, temperature=0.0)

    assert model.training
    with pytest.raises(InvalidSetting, match="generator"):
        generate(model, b"ab", max_new_bytes=2)
    with pytest.raises(InvalidSetting, match="prompt"):
        generate(model, b"", max_new_bytes=2, temperature=0.0)


def test_build_model_is_a_byte_transformer_on_the_requested_device() -> None:
    model = build_model(TINY, seed=0, device=torch.device("cpu"))

    assert isinstance(model, ByteTransformer)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    with pytest.raises(InvalidSetting, match="seed"):
        build_model(TINY, seed=-1)

"""BlockTrainConfig: every bad field refused by name (``InvalidSetting``); a manifest table round-trips."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from gossamer.protocols.blocktrain.core import BlockTrainConfig
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import read_table


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "d_model: 30 is not divisible by n_heads=4"),
        ({"num_blocks": 0}, "num_blocks must be >= 1, got 0"),
        ({"layers_per_block": True}, "layers_per_block must be an integer, got True"),
        ({"vocab": 1}, "vocab must be >= 2, got 1"),
        ({"sigma_min": 10.0, "sigma_max": 1.0}, "sigma_min: 10.0 must be below sigma_max=1.0"),
        ({"sigma_min": 0.0}, "sigma_min must be > 0, got 0.0"),
        ({"sigma_max": float("inf")}, "sigma_max must be a finite number, got inf"),
        ({"p_std": 0.0}, "p_std must be > 0, got 0.0"),
        ({"sigma_data": -0.5}, "sigma_data must be > 0, got -0.5"),
        ({"p_mean": "x"}, "p_mean must be a finite number, got 'x'"),
        ({"embedding": "learned"}, "embedding 'learned' is not one of frozen, averaged"),
        ({"sigma_min": 1e30, "sigma_max": 1e31}, "sigma_min/sigma_max: .* holds too little mass"),
    ],
)
def test_config_refuses_bad_fields_and_names_them(overrides: dict, message: str) -> None:
    with pytest.raises(InvalidSetting, match=message):
        BlockTrainConfig(**overrides)


def test_numbers_become_floats_where_the_field_is_a_float() -> None:
    config = BlockTrainConfig(sigma_min=2, sigma_max=80, p_mean=0)
    assert all(isinstance(v, float) for v in (config.sigma_min, config.sigma_max, config.p_mean))


def test_a_manifest_table_round_trips_and_unknown_keys_are_refused() -> None:
    config = read_table(BlockTrainConfig, {"d_model": 64, "num_blocks": 2, "sigma_max": 80}, path="model")

    assert (config.d_model, config.num_blocks, config.sigma_max) == (64, 2, 80.0)
    assert read_table(BlockTrainConfig, asdict(config), path="model") == config
    with pytest.raises(InvalidSetting, match=r"model: unknown keys \['num_block'\]"):
        read_table(BlockTrainConfig, {"num_block": 2}, path="model")
    with pytest.raises(InvalidSetting, match="model must be a table"):
        read_table(BlockTrainConfig, [("d_model", 64)], path="model")

"""BlockTrainConfig: every bad field refused by name; manifest tables round-trip."""

from __future__ import annotations

import pytest

from gossamer.protocols.blocktrain.core import (
    BlockTrainConfig,
    BlockTrainError,
)
from gossamer.protocols.core.errors import ProtocolError


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 30, "n_heads": 4}, "d_model"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"layers_per_block": True}, "layers_per_block"),
        ({"vocab": 1}, "vocab"),
        ({"sigma_min": 10.0, "sigma_max": 1.0}, "sigma_min"),
        ({"sigma_min": 0.0}, "sigma_min"),
        ({"sigma_max": float("inf")}, "sigma_max"),
        ({"p_std": 0.0}, "p_std"),
        ({"sigma_data": -0.5}, "sigma_data"),
        ({"p_mean": "x"}, "p_mean"),
        ({"embedding": "learned"}, "embedding"),
        ({"sigma_min": 1e30, "sigma_max": 1e31}, "sigma_min/sigma_max"),
    ],
)
def test_config_refuses_bad_fields_and_names_them(overrides: dict, field: str) -> None:
    with pytest.raises(BlockTrainError, match=field):
        BlockTrainConfig(**overrides)


def test_config_from_dict_round_trips_and_refuses_unknown_keys() -> None:
    config = BlockTrainConfig.from_dict({"d_model": 64, "num_blocks": 2, "sigma_max": 80})

    assert (config.d_model, config.num_blocks, config.sigma_max) == (64, 2, 80.0)
    assert BlockTrainConfig.from_dict(config.to_dict()) == config
    with pytest.raises(BlockTrainError, match="num_block"):
        BlockTrainConfig.from_dict({"num_block": 2})
    with pytest.raises(BlockTrainError, match="table"):
        BlockTrainConfig.from_dict([("d_model", 64)])  # type: ignore[arg-type]
    assert issubclass(BlockTrainError, ProtocolError)

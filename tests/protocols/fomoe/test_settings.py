"""A FoMoE run's manifest settings: the keys where they always were (the text-run keys read into
``settings.text``), defaults, and bad values refused with the field named."""

from __future__ import annotations

import pytest

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.fomoe.core import FomoeConfig
from gossamer.protocols.fomoe.settings import FomoeSettings
from gossamer.protocols.registry import PLUGINS


def fomoe_settings(**tables) -> FomoeSettings:
    return PLUGINS.plugin("fomoe").read_settings(RunConfig(name="f", protocol="fomoe", **tables))


def test_defaults_and_manifest_values_under_their_usual_keys() -> None:
    default = fomoe_settings()
    assert (default.text.batch_size, default.text.num_shards, default.text.eval_batches) == (16, 16, 4)
    assert (default.text.data_source, default.text.max_norm, default.rounds) == ("builtin:pydoc", 1e4, 0)

    settings = fomoe_settings(model={"n_experts": 4, "top_k": 1}, data={"source": "/tmp/t.txt", "heldout_fraction": 0.1},
                              hyper={"rounds": 3, "batch_size": 8, "seed": 5, "num_shards": 2, "max_norm": 10,
                                     "min_hosts": 2, "fomoe": {"replication": 3, "aux_loss_weight": 0},
                                     "aggregator": {"dense": "trimmed_mean", "f": 1}})
    assert (settings.model.n_experts, settings.model.top_k, settings.rounds, settings.min_hosts) == (4, 1, 3, 2)
    assert (settings.text.data_source, settings.text.heldout_fraction) == ("/tmp/t.txt", 0.1)
    assert (settings.text.batch_size, settings.text.seed, settings.text.num_shards, settings.text.max_norm) == (8, 5, 2, 10.0)
    assert settings.fomoe == FomoeConfig(replication=3, aux_loss_weight=0.0)
    assert (settings.dense_aggregator, settings.aggregator_params) == ("trimmed_mean", {"f": 1})


@pytest.mark.parametrize(("tables", "message"), [
    ({"hyper": {"num_shards": 0}}, r"hyper\.num_shards must be >= 1, got 0"),
    ({"hyper": {"commit_deadline_s": 0}}, r"hyper\.commit_deadline_s must be > 0"),
    ({"hyper": {"fomoe": {"replication": 0}}}, r"hyper\.fomoe\.replication must be >= 1"),
    ({"hyper": {"fomoe": {"aux_loss_weight": -1}}}, r"hyper\.fomoe\.aux_loss_weight must be >= 0"),
    ({"model": {"n_experts": 2, "top_k": 3}}, r"top_k must be <= n_experts = 2, got 3"),
    ({"hyper": {"aggregator": {"dense": "trimmed_mean", "f": -1}}}, r"hyper\.aggregator: f must be an integer >= 0"),
    ({"hyper": {"steps": 3}}, r"hyper: unknown keys \['steps'\]"),
])
def test_bad_values_are_refused_naming_the_field(tables: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        fomoe_settings(**tables)


def test_config_classes_built_in_code_are_checked_like_a_manifest() -> None:
    with pytest.raises(InvalidSetting, match="replication must be an integer"):
        FomoeConfig(replication=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidSetting, match="renormalize_skipped must be true or false"):
        FomoeConfig(renormalize_skipped=1)  # type: ignore[arg-type]
    assert isinstance(FomoeConfig(aux_loss_weight=0).aux_loss_weight, float)

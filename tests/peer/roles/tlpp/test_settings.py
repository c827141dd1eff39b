"""TL++ manifest settings: defaults, and a clear ConfigError naming the field for every bad value."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from gossamer.peer.cli.swarm import SwarmOptions, load_swarm_config
from gossamer.peer.errors import ConfigError
from gossamer.peer.roles import PLUGINS
from gossamer.peer.roles.tlpp.settings import TlppSettings
from gossamer.peer.run.manifest import RunConfig, run_config_from_dict


def config(**tables: dict[str, Any]) -> RunConfig:
    return RunConfig(name="t", protocol="tlpp", **tables)


def tlpp_settings(run: RunConfig) -> TlppSettings:
    return PLUGINS.plugin("tlpp").read_settings(run)


def test_defaults_and_overrides() -> None:
    settings = tlpp_settings(config(model={"cut": 2, "channels": [8, 8, 8], "hidden": 16},
                                    hyper={"mode": "base", "steps": 7, "optimizer": "sgd", "lr": 1}))

    assert (settings.cut, settings.channels, settings.hidden, settings.steps, settings.lr) == (2, (8, 8, 8), 16, 7, 1.0)
    assert tlpp_settings(config()) == TlppSettings()
    model = settings.build_model("cpu")
    node_side, server_side = settings.split(model)
    assert len(node_side) == 2 and len(server_side) == 2


@pytest.mark.parametrize(("tables", "field"), [
    ({"model": {"name": "resnet"}}, "model.name"),
    ({"model": {"cut": 0}}, "model.cut"),
    ({"model": {"cut": 4}}, "model.cut"),
    ({"model": {"cut": "3"}}, "model.cut"),
    ({"model": {"channels": [8, 8]}}, "model.channels"),
    ({"model": {"depth": 3}}, "model: unknown keys"),
    ({"hyper": {"mode": "secure"}, "model": {"cut": 2}}, "needs model.cut = 3"),
    ({"hyper": {"mode": "private"}}, "hyper.mode"),
    ({"hyper": {"optimizer": "lion"}}, "hyper.optimizer"),
    ({"hyper": {"batch_size": 0}}, "hyper.batch_size"),
    ({"hyper": {"batch_size": True}}, "hyper.batch_size"),
    ({"hyper": {"lr": -1.0}}, "hyper.lr"),
    ({"hyper": {"lr": float("nan")}}, "hyper.lr"),
    ({"hyper": {"steps": 0, "epochs": 0}}, "hyper.steps and hyper.epochs"),
    ({"hyper": {"max_failure": 2.0}}, "hyper.max_failure"),
    ({"hyper": {"helper_wait_s": 30.0}}, "hyper.helper_wait_s"),
    ({"hyper": {"min_nodes": 0}}, "hyper.min_nodes"),
    ({"hyper": {"drop_last": 1}}, "hyper.drop_last"),
    ({"hyper": {"rounds": 3}}, "hyper: unknown keys"),
    ({"data": {"test_fraction": 1.0}}, "data.test_fraction"),
    ({"data": {"num_shards": 0}}, "data.num_shards"),
    ({"data": {"test": 5}}, "data.test"),
])
def test_bad_settings_are_refused_naming_the_field(tables: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        tlpp_settings(config(**tables))


def test_a_run_of_another_protocol_is_refused() -> None:
    with pytest.raises(ConfigError, match="protocol 'diloco'"):
        tlpp_settings(RunConfig(name="t", protocol="diloco"))


def test_the_swarm_preset_is_a_valid_tlpp_run() -> None:
    text, _doc, swarm = load_swarm_config(SwarmOptions(preset="tlpp"))
    settings = tlpp_settings(run_config_from_dict(tomllib.loads(text)))

    assert settings.mode == "base" and settings.min_nodes == swarm["peers"] and swarm["roles"] == ["node"]

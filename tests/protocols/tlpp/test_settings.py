"""TL++ manifest settings: defaults, and a clear ConfigError naming the field for every bad value."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import torch

from gossamer.peer.cli.swarm import SwarmOptions, load_swarm_config
from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig, run_config_from_dict
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import describe
from gossamer.protocols.registry import PLUGINS
from gossamer.protocols.tlpp.core import Normalize
from gossamer.protocols.tlpp.settings import TlppSettings

PIN = "ab" * 32  # a helper's peer id: secure mode needs one
SECURE = {"mode": "secure", "helper": PIN, "min_nodes": 2}


def config(**tables: dict[str, Any]) -> RunConfig:
    return RunConfig(name="t", protocol="tlpp", **tables)


def tlpp_settings(run: RunConfig) -> TlppSettings:
    return PLUGINS.plugin("tlpp").read_settings(run)


def test_defaults_and_overrides() -> None:
    settings = tlpp_settings(config(model={"cut": 2, "channels": [8, 8, 8], "hidden": 16},
                                    hyper={"mode": "base", "steps": 7, "optimizer": "sgd", "lr": 1}))

    assert (settings.cut, settings.channels, settings.hidden, settings.steps, settings.lr) == (2, (8, 8, 8), 16, 7, 1.0)
    assert tlpp_settings(config()) == TlppSettings()
    assert TlppSettings().cut == 3 and TlppSettings().model == "" and TlppSettings().num_stages == 4
    model = settings.build_model("cpu")
    node_side, orchestrator_side = settings.split(model)
    assert len(node_side) == 2 and len(orchestrator_side) == 2


DECLARED = """
[model]
input_shape = [1, 28, 28]
num_classes = 10
stages = [
  ["conv 16", "relu", "maxpool 2"],
  ["conv 32 5 stride=1 pad=2", "gelu", "avgpool 2"],
  ["residual 32 stride=2", "globalpool", "linear 64", "tanh"],
  ["linear 10"],
]
[data]
normalize = "nodes"
[hyper]
mode = "secure"
helper = "abababababababababababababababababababababababababababababababab"
min_nodes = 2
"""


def test_a_declared_model_from_a_run_config_is_built_the_same_on_every_host() -> None:
    doc = {"run": {"name": "t", "protocol": "tlpp"}, **tomllib.loads(DECLARED)}
    settings = tlpp_settings(run_config_from_dict(doc))
    a, b = settings.build_model("cpu"), settings.build_model("cpu")

    assert settings.cut == 3 and settings.num_stages == 4 and settings.secure
    assert a(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert settings.normalization(a) is a[0][0] and isinstance(a[0][0], Normalize)
    assert {"0.0.mean", "0.0.std", "0.1.weight", "2.0.conv1.weight", "2.0.skip.weight", "3.0.weight"} <= set(a.state_dict())
    node_side, orchestrator_side = settings.split(a)
    assert node_side(torch.rand(3, 1, 28, 28)).shape == (3, 64) and len(orchestrator_side) == 1


@pytest.mark.parametrize(("name", "input_shape", "cut"), [
    ("digits_cnn", [1, 28, 28], 3), ("rgb_cnn", [3, 32, 32], 3), ("tabular_mlp", [20], 2), ("resnet_small", [3, 32, 32], 3)])
def test_every_builtin_builds_for_its_inputs_and_its_default_cut_is_the_secure_one(
        name: str, input_shape: list[int], cut: int) -> None:
    settings = tlpp_settings(config(model={"name": name, "input_shape": input_shape, "num_classes": 7},
                                    hyper=SECURE))
    model = settings.build_model("cpu")

    assert settings.cut == cut and model(torch.rand(2, *input_shape)).shape == (2, 7)


def test_fixed_normalization_is_in_the_model() -> None:
    settings = tlpp_settings(config(model={"input_shape": [3, 8, 8], "channels": [4, 4, 4]},
                                    data={"normalize": "fixed", "mean": [0.5, 0.25, 0.0], "std": [2.0, 1.0, 0.5]}))
    layer = settings.normalization(settings.build_model("cpu"))

    assert layer is not None and layer.mean.flatten().tolist() == [0.5, 0.25, 0.0]
    torch.testing.assert_close(layer(torch.ones(1, 3, 8, 8))[0, :, 0, 0], torch.tensor([0.25, 0.75, 2.0]))


@pytest.mark.parametrize(("tables", "field"), [
    ({"model": {"name": "resnet"}}, "model.name"),
    ({"model": {"cut": -1}}, "model.cut"),
    ({"model": {"cut": 4}}, "model.cut"),
    ({"model": {"cut": "3"}}, "model.cut"),
    ({"model": {"channels": [8, 8]}}, "model.channels"),
    ({"model": {"depth": 3}}, "model: unknown keys"),
    ({"hyper": {"mode": "secure"}, "model": {"cut": 2}},
     "hyper.mode = \"secure\": model.name = 'digits_cnn': stages[2] ('conv 32', 'relu', 'maxpool 2', 'flatten', "
     "'linear 64', 'relu') is above the cut (2) and 'conv' is not affine"),
    ({"hyper": {"mode": "secure"}, "model": {"stages": [["flatten", "linear 64"], ["linear 10", "relu"]],
                                             "input_shape": [1, 4, 4]}},
     "model.stages[1] ('linear 10', 'relu') is above the cut (1) and 'relu' is not affine"),
    ({"hyper": {"mode": "secure"}, "model": {"stages": [["flatten"], ["linear 64"], ["linear 10"]], "cut": 1,
                                             "input_shape": [1, 4, 4]}},
     "model.stages[2] ('linear 10') is above the cut (1) and it is a second 'linear' layer"),
    ({"model": {"name": "digits_cnn", "stages": [["flatten"], ["linear 10"]]}}, "not both"),
    ({"model": {"stages": [["flatten"], ["linear 10"]], "hidden": 5}}, "model.channels and model.hidden"),
    ({"model": {"stages": [["flatten", "linear 64"], ["linear 10"]], "input_shape": [1, 28]}}, "model.input_shape"),
    ({"model": {"stages": [["conv 8", "relu"], ["linear 10"]], "input_shape": [1, 28, 28]}},
     "model.stages[1][0] 'linear 10': needs a flat input [F], got [8, 28, 28]; put 'flatten'"),
    ({"model": {"stages": [["conv 8 5 stride=2"], ["maxpool 15"], ["flatten", "linear 10"]], "input_shape": [1, 28, 28]}},
     "model.stages[1][0] 'maxpool 15': kernel 15 does not fit an input of size 14"),
    ({"model": {"stages": [["dropout 0.5"], ["linear 10"]]}}, "model.stages[0][0] 'dropout 0.5': unknown layer"),
    ({"model": {"stages": [["flatten", "linear 64"], ["linear 7"]]}}, "model.stages[1]: the stack ends in [7]"),
    ({"model": {"stages": [["flatten", "linear 10"]]}}, "at least 2 stages"),
    ({"model": {"stages": [["flatten"], "linear 10"]}}, "model.stages[1] must be a list"),
    ({"model": {"name": "tabular_mlp", "input_shape": [1, 8, 8]}},
     "model.name = 'tabular_mlp': stages[0][0] 'linear 64': needs a flat input"),
    ({"model": {"name": "digits_cnn", "input_shape": [20]}}, "needs an image input [C, H, W], got [20]"),
    ({"model": {"name": "tabular_mlp", "input_shape": [20], "cut": 3}}, "model.cut: must be an int in [1, 2] for 3 stages"),
    ({"model": {"name": "resnet_small", "hidden": 3}}, "model.hidden: resnet_small has no hidden"),
    ({"model": {"num_classes": 1}}, "model.num_classes"),
    ({"data": {"normalize": "fixed", "mean": [0.5]}}, "data.mean and data.std with 1 value(s) each"),
    ({"data": {"normalize": "fixed", "mean": [0.5], "std": [0.0]}}, "std > 0"),
    ({"data": {"mean": [0.5], "std": [1.0]}}, "read only with data.normalize = \"fixed\""),
    ({"data": {"normalize": "nodes"}, "model": {"name": "tabular_mlp", "input_shape": [300], "cut": 1}},
     "at most 256 channels"),
    ({"data": {"normalize": "mean"}}, "data.normalize"),
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
    ({"hyper": {"mode": "secure"}}, "needs hyper.helper, the peer id of the run's one helper"),
    ({"hyper": {**SECURE, "helper": "AB" * 32}}, "needs hyper.helper"),
    ({"hyper": {"helper": PIN}}, "hyper.helper is read only in secure mode"),
    ({"hyper": {**SECURE, "optimizer": "sgd"}}, "refuses hyper.optimizer = \"sgd\""),
    ({"hyper": {**SECURE, "min_batch": 19}}, "hyper.min_batch = 19: secure mode needs at least 2 x num_classes = 20"),
    ({"hyper": {**SECURE, "batch_size": 16}}, "hyper.batch_size = 16 is below hyper.min_batch = 20"),
    ({"hyper": {**SECURE, "min_nodes": 1}}, "hyper.min_nodes = 1 is below hyper.min_sum_nodes = 2"),
    ({"hyper": {**SECURE, "min_sum_nodes": 1}}, "hyper.min_sum_nodes"),
    ({"data": {"test_fraction": 1.0}}, "data.test_fraction"),
    ({"data": {"num_shards": 0}}, "data.num_shards"),
    ({"data": {"test": 5}}, "data.test"),
])
def test_bad_settings_are_refused_naming_the_field(tables: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)):
        tlpp_settings(config(**tables))


def test_a_run_of_another_protocol_is_refused() -> None:
    with pytest.raises(ConfigError, match="protocol 'diloco'"):
        tlpp_settings(RunConfig(name="t", protocol="diloco"))


def test_the_swarm_preset_is_a_valid_tlpp_run() -> None:
    text, _doc, swarm = load_swarm_config(SwarmOptions(preset="tlpp"))
    settings = tlpp_settings(run_config_from_dict(tomllib.loads(text)))

    assert settings.mode == "base" and settings.min_nodes == swarm["peers"] and swarm["roles"] == ["node"]


def test_pacing_settings_default_to_fixed_and_a_floor_above_the_ceiling_is_refused() -> None:
    default = tlpp_settings(config())
    adaptive = tlpp_settings(config(hyper={"pacing": "adaptive", "node_floor_s": 2.0}))

    assert (default.pacing, default.node_floor_s, adaptive.pacing, adaptive.node_floor_s) == ("fixed", 5.0,
                                                                                             "adaptive", 2.0)
    with pytest.raises(ConfigError, match=r"hyper\.node_floor_s"):
        tlpp_settings(config(hyper={"pacing": "adaptive", "node_timeout_s": 3.0}))
    with pytest.raises(ConfigError, match=r"hyper\.pacing"):
        tlpp_settings(config(hyper={"pacing": "eager"}))


def test_settings_built_in_code_are_checked_like_a_manifest_and_every_one_has_its_help() -> None:
    assert TlppSettings(input_shape=[1, 8, 8], lr=1).input_shape == (1, 8, 8)  # type: ignore[arg-type]
    with pytest.raises(InvalidSetting, match="batch_size must be >= 1"):
        TlppSettings(batch_size=0)
    with pytest.raises(InvalidSetting, match="mode 'plain' is not one of base, secure"):
        TlppSettings(mode="plain")

    assert [row.where for row in describe(TlppSettings) if not row.doc] == []

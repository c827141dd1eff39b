"""A blocktrain run's manifest settings: defaults, and every bad value refused with the field named."""

from __future__ import annotations

import pytest

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.blocktrain.settings import BlockTrainSettings, BlockTrainText
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.text_data import TextRun
from gossamer.protocols.registry import PLUGINS


def config(**tables) -> RunConfig:
    return RunConfig(name="bt", protocol="blocktrain", **tables)


def blocktrain_settings(run: RunConfig):
    return PLUGINS.plugin("blocktrain").read_settings(run)


def test_defaults_and_manifest_values() -> None:
    settings = blocktrain_settings(config(model={"d_model": 32, "n_heads": 2, "num_blocks": 3},
                                          hyper={"versions": 5, "lr": 0.01, "deadline_s": 3},
                                          data={"source": "/tmp/x.txt", "heldout_fraction": 0.1}))

    assert (settings.model.d_model, settings.model.num_blocks, settings.model.embedding) == (32, 3, "frozen")
    assert (settings.versions, settings.lr, settings.deadline_s, settings.local_steps) == (5, 0.01, 3.0, 20)
    assert (settings.text.data_source, settings.text.heldout_fraction) == ("/tmp/x.txt", 0.1)
    assert (settings.text.eval_batches, settings.text.batch_size, settings.text.seed) == (2, 16, 0)


def test_evaluation_may_be_switched_off_unlike_in_the_other_text_runs() -> None:
    assert blocktrain_settings(config(hyper={"eval_batches": 0})).text.eval_batches == 0
    with pytest.raises(InvalidSetting, match="eval_batches must be >= 1, got 0"):
        TextRun(eval_batches=0)


def test_settings_built_in_code_are_checked_like_a_manifest() -> None:
    with pytest.raises(InvalidSetting, match="versions must be >= 0, got -2"):
        BlockTrainSettings(versions=-2)
    with pytest.raises(InvalidSetting, match="eval_batches must be >= 0, got -1"):
        BlockTrainSettings(text=BlockTrainText(eval_batches=-1))


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"hyper": {"rounds": 3}}, r"hyper: unknown keys \['rounds'\]"),
        ({"hyper": {"local_steps": 0}}, "hyper.local_steps must be >= 1"),
        ({"hyper": {"versions": -1}}, "hyper.versions must be >= 0"),
        ({"hyper": {"deadline_s": 0}}, "hyper.deadline_s must be > 0"),
        ({"hyper": {"lr": "fast"}}, "hyper.lr must be a finite number"),
        ({"hyper": {"lr": float("nan")}}, "hyper.lr must be a finite number"),
        ({"hyper": {"batch_size": 2.5}}, "hyper.batch_size must be an integer"),
        ({"hyper": {"local_steps": 2.7}}, "hyper.local_steps must be an integer"),
        ({"hyper": {"max_batch": True}}, "hyper.max_batch must be an integer"),
        ({"model": {"width": 3}}, r"model: .*unknown keys \['width'\]"),
        ({"model": {"d_model": 30, "n_heads": 4}}, "model: d_model: 30 is not divisible"),
        ({"model": {"d_model": "30"}}, "model.d_model must be an integer"),
        ({"model": {"embedding": "learned"}}, "model.embedding 'learned' is not one of frozen, averaged"),
        ({"model": {"vocab": 1}}, "model.vocab must be >= 2, got 1"),
        ({"hyper": {"eval_batches": -1}}, "hyper.eval_batches must be >= 0, got -1"),
        ({"hyper": {"max_norm": 0}}, "hyper.max_norm must be > 0"),
        ({"data": {"heldout_fraction": 2}}, "data.heldout_fraction must be < 1"),
        ({"data": {"path": "x"}}, r"data: unknown keys \['path'\]"),
        ({"hyper": {"sample_prompt": ""}}, "hyper.sample_prompt: must be at least one byte"),
        ({"model": {"vocab": 16}}, r"hyper.sample_bytes: a sample needs a byte vocabulary"),
        ({"hyper": {"sample_temperature": -1}}, "hyper.sample_temperature must be >= 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(tables: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        blocktrain_settings(config(**tables))


def test_another_protocols_run_is_refused() -> None:
    with pytest.raises(ConfigError, match="uses protocol 'diloco', not 'blocktrain'"):
        blocktrain_settings(RunConfig(name="d", protocol="diloco"))


def test_the_orchestrator_of_a_blocktrain_run_is_its_block_coordinator() -> None:
    assert PLUGINS.plugin("blocktrain").owner_roles == ("block-coordinator",)
    assert PLUGINS.plugin("diloco").owner_roles == ()

"""The one settings reader: types from the annotations, bounds from the fields, unknown keys and
tables refused, and every refusal naming the field as the run config spells it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gossamer.peer.errors import ConfigError
from gossamer.peer.plugin import run_settings
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.models import ModelConfig
from gossamer.protocols.core.settings import check, describe, markdown_table, read_settings, setting
from gossamer.protocols.registry import PLUGINS


@dataclass(frozen=True, kw_only=True)
class Example:
    model: ModelConfig = setting(table="model", key="*", default_factory=ModelConfig)
    source: str = setting("builtin:pydoc", table="data")
    rounds: int = setting(0, table="hyper", low=0)
    lr: float = setting(0.1, table="hyper", above=0.0)
    fraction: float = setting(0.5, table="hyper", above=0.0, below=1.0)
    verbose: bool = setting(False, table="hyper")
    mode: str = setting("a", table="hyper", choices=("a", "b"))
    sizes: tuple[int, int] = setting((1, 2), table="hyper")
    names: tuple[str, ...] = setting((), table="hyper.inner")
    extra: dict[str, Any] = setting(table="hyper.inner", rest=True, default_factory=dict)


def read(**tables: Any) -> Example:
    return read_settings(Example, tables)


def test_defaults_come_from_the_dataclass_and_values_from_their_tables() -> None:
    assert read() == Example()
    got = read(model={"d_model": 64}, data={"source": "f.txt"},
               hyper={"rounds": 3, "lr": 1, "sizes": [3, 4], "inner": {"names": ["x"], "k": 5}})
    assert (got.model.d_model, got.source, got.rounds, got.lr, got.sizes) == (64, "f.txt", 3, 1.0, (3, 4))
    assert isinstance(got.lr, float) and got.names == ("x",) and got.extra == {"k": 5}


@pytest.mark.parametrize(("tables", "message"), [
    ({"hyper": {"rounds": 2.7}}, "hyper.rounds must be an integer, got 2.7"),
    ({"hyper": {"rounds": True}}, "hyper.rounds must be an integer, got True"),
    ({"hyper": {"rounds": "8"}}, "hyper.rounds must be an integer, got '8'"),
    ({"hyper": {"rounds": -1}}, "hyper.rounds must be >= 0, got -1"),
    ({"hyper": {"lr": True}}, "hyper.lr must be a finite number, got True"),
    ({"hyper": {"lr": float("inf")}}, "hyper.lr must be a finite number"),
    ({"hyper": {"lr": 0}}, "hyper.lr must be > 0, got 0"),
    ({"hyper": {"fraction": 1.0}}, "hyper.fraction must be < 1, got 1.0"),
    ({"hyper": {"verbose": 1}}, "hyper.verbose must be true or false, got 1"),
    ({"hyper": {"mode": "c"}}, "hyper.mode 'c' is not one of a, b"),
    ({"hyper": {"sizes": [1]}}, r"hyper.sizes must be a list of 2 values, got \[1\]"),
    ({"hyper": {"sizes": [1, "2"]}}, r"hyper.sizes\[1\] must be an integer, got '2'"),
    ({"hyper": {"inner": {"names": "x"}}}, "hyper.inner.names must be a list"),
    ({"hyper": {"inner": 3}}, "hyper.inner must be a table"),
    ({"hyper": {"epochs": 1}}, r"hyper: unknown keys \['epochs'\]"),
    ({"data": {"path": "x"}}, r"data: unknown keys \['path'\]"),
    ({"model": {"width": 3}}, r"model: unknown keys \['width'\]"),
    ({"model": {"d_model": 2.5}}, "model.d_model must be an integer"),
    ({"model": {"d_model": 30, "n_heads": 4}}, "model: d_model: 30 is not divisible by n_heads=4"),
])
def test_every_wrong_type_or_value_is_refused_naming_the_field(tables: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSetting, match=message):
        read(**tables)


@pytest.mark.parametrize(("hyper", "message"), [
    ({"rounds": 2.7}, "hyper.rounds must be an integer, got 2.7"),
    ({"w1_grace_s": True}, "hyper.w1_grace_s must be a finite number, got True"),
    ({"batch_size": "8"}, "hyper.batch_size must be an integer, got '8'"),
])
def test_the_diloco_settings_no_longer_coerce_wrong_types(hyper: dict[str, Any], message: str) -> None:
    """Regression: the DiLoCo reader used to turn 2.7 rounds into 2, true into 1.0 and "8" into 8."""
    with pytest.raises(ConfigError, match=message):
        PLUGINS.plugin("diloco").read_settings(RunConfig(name="r", protocol="diloco", hyper=hyper))


def test_a_table_no_setting_reads_is_refused() -> None:
    @dataclass(frozen=True, kw_only=True)
    class OnlyHyper:
        rounds: int = setting(0, table="hyper")

    with pytest.raises(ConfigError, match=r"\[model\] is not used by this protocol"):
        run_settings(OnlyHyper, RunConfig(name="r", protocol="x", model={"d_model": 8}))


def test_describe_lists_every_setting_where_the_run_config_spells_it() -> None:
    rows = {row.where: row.default for row in describe(Example)}
    assert rows["hyper.rounds"] == 0 and rows["data.source"] == "builtin:pydoc" and rows["model.d_model"] == 128


@dataclass(frozen=True, kw_only=True)
class Checked:
    width: int = setting(8, low=1, doc="how wide")
    rate: float = setting(0.5, above=0.0, below=1.0)
    names: tuple[str, ...] = setting(())
    where: Path = setting(Path("out"))

    def __post_init__(self) -> None:
        check(self)


def test_check_validates_an_instance_built_in_code_and_normalises_its_values() -> None:
    built = Checked(width=3, rate=1 // 2 + 0.25, names=["a"])  # type: ignore[arg-type]
    assert built.names == ("a",) and isinstance(built.rate, float)
    assert isinstance(Checked(rate=0.5).rate, float)
    assert Checked(where="a/b").where == Path("a/b")  # type: ignore[arg-type]
    for kwargs, message in (({"width": 0}, "width must be >= 1, got 0"), ({"width": 2.5}, "width must be an integer"),
                            ({"rate": 1}, "rate must be < 1, got 1"), ({"names": "ab"}, "names must be a list"),
                            ({"where": 3}, "where must be a path")):
        with pytest.raises(InvalidSetting, match=message):
            Checked(**kwargs)


@dataclass(frozen=True, kw_only=True)
class Spread:
    batch: int = setting(16, table="hyper", low=1, doc="sequences per step")
    source: str = setting("builtin:pydoc", table="data")


@dataclass(frozen=True, kw_only=True)
class WithSpread:
    text: Spread = setting(spread=True, default_factory=lambda: Spread(batch=8))
    rounds: int = setting(0, table="hyper", low=0)


def test_a_spread_setting_reads_its_fields_from_their_own_tables_under_the_protocols_defaults() -> None:
    assert read_settings(WithSpread, {}) == WithSpread(text=Spread(batch=8))
    got = read_settings(WithSpread, {"hyper": {"rounds": 2}, "data": {"source": "f.txt"}})
    assert got == WithSpread(text=Spread(batch=8, source="f.txt"), rounds=2)
    with pytest.raises(InvalidSetting, match=r"hyper\.batch must be >= 1, got 0"):
        read_settings(WithSpread, {"hyper": {"batch": 0}})
    with pytest.raises(InvalidSetting, match=r"hyper: unknown keys \['epochs'\]"):
        read_settings(WithSpread, {"hyper": {"epochs": 1}})


def test_the_markdown_table_shows_each_setting_with_the_protocols_default_bounds_and_help() -> None:
    table = markdown_table(WithSpread)
    assert "| `hyper.batch` | int | `8` | >= 1 | sequences per step |" in table
    assert "| `hyper.rounds` | int | `0` | >= 0 |  |" in table

"""One reader from a run's manifest tables into a protocol's settings dataclass.

A protocol declares its settings once, as a frozen dataclass whose fields carry their defaults,
their manifest table and their bounds (``setting(...)``); ``read_settings`` then does for every
protocol what each one used to do by hand, the same way:

- every key of every table the settings read must be a field (unknown keys are refused, listing
  the known ones);
- every value must have its field's type (from the annotation: ``int`` refuses ``2.7`` and
  ``true``, ``float`` takes an integer but refuses a string or a bool, ``bool`` takes only
  ``true``/``false``, ``str``, fixed and variable ``tuple[...]`` from TOML arrays, ``dict`` for a
  free table, a nested dataclass for a whole table, unions of these) and lie in its declared
  bounds;
- the dataclass's own ``__post_init__`` checks what relates several fields.

Every refusal is a ``ConfigError`` that names the field as the run config spells it
(``hyper.rounds must be an integer, got 2.7``). A nested dataclass from ``protocols/`` (a model
config, say) is read the same way, field by field, and its own checks' errors are prefixed with
its table. A table read whole may hold a nested table that another field reads (``[model]`` as
a model config beside ``[model.subspace]`` as the subspace config): that one is the other field's.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.core.errors import ProtocolError

S = TypeVar("S")
_META = "gossamer.setting"
TOP_TABLES = ("model", "data", "hyper")


@dataclasses.dataclass(frozen=True)
class SettingSpec:
    """Where a field comes from and what it may hold (the metadata ``setting`` attaches)."""

    table: str  # dotted table path in the run config, e.g. "hyper" or "hyper.diloco"
    key: str | None = None  # the key in that table; None: the field's name; "*" for the whole table
    rest: bool = False  # a dict field that takes every key of ``table`` no other field claims
    choices: Collection[Any] | None = None
    low: float | None = None  # inclusive lower bound
    above: float | None = None  # exclusive lower bound
    high: float | None = None  # inclusive upper bound
    below: float | None = None  # exclusive upper bound


def setting(default: Any = dataclasses.MISSING, *, table: str, key: str | None = None,
            default_factory: Any = dataclasses.MISSING, rest: bool = False,
            choices: Collection[Any] | None = None, low: float | None = None, above: float | None = None,
            high: float | None = None, below: float | None = None) -> Any:
    """A settings field read from ``table`` (``key="*"``: the whole table, for a nested dataclass)."""
    spec = SettingSpec(table=table, key=key, rest=rest, choices=choices, low=low, above=above, high=high,
                       below=below)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_META: spec})


def read_settings(cls: type[S], config: RunConfig) -> S:
    """Build ``cls`` from ``config``'s tables; ConfigError names the run config field at fault."""
    tables = {"model": config.model, "data": config.data, "hyper": config.hyper}
    specs = _specs(cls)
    claimed: dict[str, set[str]] = {}
    whole: set[str] = set()  # tables read as a whole by a nested dataclass (it checks their keys)
    kwargs: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    subtables = {spec.table for spec in specs.values()}
    for field in dataclasses.fields(cls):
        spec = specs[field.name]
        table = _table(tables, spec.table)
        if spec.rest:
            continue
        key = field.name if spec.key is None else spec.key
        if key == "*":
            _claim_path(claimed, spec.table)
            whole.add(spec.table)
            own = {k: v for k, v in table.items() if f"{spec.table}.{k}" not in subtables}
            kwargs[field.name] = read_table(hints[field.name], own, path=spec.table)
            continue
        claimed.setdefault(spec.table, set()).add(key)
        _claim_path(claimed, spec.table)
        if key in table:
            kwargs[field.name] = _checked(f"{spec.table}.{key}", table[key], hints[field.name], spec)
    for field in dataclasses.fields(cls):
        spec = specs[field.name]
        if spec.rest:
            table = _table(tables, spec.table)
            kwargs[field.name] = {k: v for k, v in table.items() if k not in claimed.get(spec.table, set())}
            claimed.setdefault(spec.table, set()).update(table)
    _refuse_unknown(tables, claimed, whole, cls)
    return _construct(cls, kwargs, path="")


def read_table(cls: Any, table: Any, *, path: str) -> Any:
    """A nested dataclass from one whole table: its fields by name, each type-checked."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path} must be a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(str(k) for k in table if k not in names)
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; known: {sorted(names)}")
    kwargs = {name: _checked(f"{path}.{name}", table[name], hints[name], SettingSpec(table=path))
              for name in names if name in table}
    return _construct(cls, kwargs, path=path)


def _construct(cls: Any, kwargs: dict[str, Any], *, path: str) -> Any:
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ProtocolError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from exc


def _specs(cls: type) -> dict[str, SettingSpec]:
    specs = {}
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(_META)
        if spec is None:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with setting(...)")
        specs[field.name] = spec
    return specs


def _table(tables: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    head, *rest = path.split(".")
    if head not in TOP_TABLES:
        raise TypeError(f"settings table {path!r} is not under one of {TOP_TABLES}")
    table: Any = tables.get(head, {})
    walked = head
    for part in rest:
        table = table.get(part, {}) if isinstance(table, Mapping) else {}
        walked = f"{walked}.{part}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{walked} must be a table, got {table!r}")
    return table


def _claim_path(claimed: dict[str, set[str]], path: str) -> None:
    """A nested table's name is a key of its parent table: claim it there."""
    parts = path.split(".")
    for depth in range(1, len(parts)):
        claimed.setdefault(".".join(parts[:depth]), set()).add(parts[depth])
    claimed.setdefault(path, set())


def _refuse_unknown(tables: Mapping[str, Any], claimed: dict[str, set[str]], whole: set[str], cls: type) -> None:
    for path in sorted(set(claimed) - whole):
        keys = claimed[path]
        unknown = sorted(str(k) for k in _table(tables, path) if k not in keys)
        if unknown:
            raise ConfigError(f"{path}: unknown keys {unknown}; known: {sorted(keys)}")
    for top in TOP_TABLES:
        if tables.get(top) and top not in claimed:
            raise ConfigError(f"[{top}] is not used by this protocol ({cls.__name__}); remove it")


def _checked(name: str, value: Any, annotation: Any, spec: SettingSpec) -> Any:
    value = _typed(name, value, annotation)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{name} {value!r} is not one of {', '.join(map(str, spec.choices))}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if spec.low is not None and not value >= spec.low:
            raise ConfigError(f"{name} must be >= {spec.low:g}, got {value}")
        if spec.above is not None and not value > spec.above:
            raise ConfigError(f"{name} must be > {spec.above:g}, got {value}")
        if spec.high is not None and not value <= spec.high:
            raise ConfigError(f"{name} must be <= {spec.high:g}, got {value}")
        if spec.below is not None and not value < spec.below:
            raise ConfigError(f"{name} must be < {spec.below:g}, got {value}")
    return value


def _typed(name: str, value: Any, annotation: Any) -> Any:
    """``value`` as the annotation's type, or ConfigError naming ``name``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(annotation):
            try:
                return _typed(name, value, option)
            except ConfigError as exc:
                errors.append(str(exc).split(" must be ", 1)[-1].split(", got")[0])
        wanted = [e for e in errors if "run config can hold" not in e]
        raise ConfigError(f"{name} must be {' or '.join(wanted)}, got {value!r}")
    if annotation is Any:
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {value!r}")
        return value
    if origin is tuple:
        return _tuple(name, value, typing.get_args(annotation))
    if origin in (dict, Mapping) or annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name} must be a table, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(annotation):
        return read_table(annotation, value, path=name)
    if origin is typing.Literal:
        if value not in typing.get_args(annotation):
            raise ConfigError(f"{name} must be one of {list(typing.get_args(annotation))}, got {value!r}")
        return value
    if origin is collections.abc.Callable:  # a predicate (e.g. for tests): not expressible in a run config
        raise ConfigError(f"{name} must be a value a run config can hold, got {value!r}")
    raise TypeError(f"settings field {name}: annotation {annotation!r} is not supported")


def _tuple(name: str, value: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{name} must be a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_typed(f"{name}[{i}]", item, args[0]) for i, item in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(f"{name} must be a list of {len(args)} values, got {value!r}")
    return tuple(_typed(f"{name}[{i}]", item, kind) for i, (item, kind) in enumerate(zip(value, args, strict=True)))


def describe(cls: type) -> list[tuple[str, str, Any]]:
    """(run config field, type, default) of every setting: for ``--help`` texts and docs."""
    rows = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        spec: SettingSpec = field.metadata[_META]
        key = field.name if spec.key is None else spec.key
        where = spec.table if key == "*" or spec.rest else f"{spec.table}.{key}"
        default = field.default if field.default is not dataclasses.MISSING else (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
        rows.append((where, getattr(hints[field.name], "__name__", str(hints[field.name])), default))
    return rows

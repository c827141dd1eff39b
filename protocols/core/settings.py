"""The one settings mechanism: fields declare their bounds, table and help in ``setting(...)``;
``check`` validates an instance, ``read_settings`` builds one from a run's manifest tables, and
``describe`` lists the fields for help texts and the protocol READMEs. Every refusal is an
``InvalidSetting`` naming the field as the run config spells it (``hyper.rounds must be ...``)."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path, PurePath
from typing import Any, TypeVar

from gossamer.protocols.core.errors import InvalidSetting, ProtocolError

S = TypeVar("S")
_META = "gossamer.setting"
TOP_TABLES = ("model", "data", "hyper")


@dataclasses.dataclass(frozen=True)
class SettingSpec:
    """Where a field comes from, what it may hold and what it means (what ``setting`` attaches)."""

    table: str | None = None  # dotted table of a run config ("hyper", "hyper.diloco"); None: read whole
    key: str | None = None  # the key in that table; None: the field's name; "*": the whole table
    rest: bool = False  # a dict field that takes every key of ``table`` no other field claims
    spread: bool = False  # a nested dataclass whose own fields say their tables
    choices: Collection[Any] | None = None
    low: float | None = None  # inclusive lower bound
    above: float | None = None  # exclusive lower bound
    high: float | None = None  # inclusive upper bound
    below: float | None = None  # exclusive upper bound
    doc: str = ""

    def bounds(self) -> str:
        """The bounds as a reader writes them: ">= 0, < 1", "one of a, b"."""
        parts = [f"{sign} {value:g}" for sign, value in
                 ((">=", self.low), (">", self.above), ("<=", self.high), ("<", self.below)) if value is not None]
        if self.choices is not None:
            parts.append("one of " + ", ".join(map(str, self.choices)))
        return ", ".join(parts)


def setting(default: Any = dataclasses.MISSING, *, doc: str = "", table: str | None = None, key: str | None = None,
            default_factory: Any = dataclasses.MISSING, rest: bool = False, spread: bool = False,
            choices: Collection[Any] | None = None, low: float | None = None, above: float | None = None,
            high: float | None = None, below: float | None = None) -> Any:
    """A settings field (a ``dataclasses.field`` with its spec as metadata)."""
    spec = SettingSpec(table=table, key=key, rest=rest, spread=spread, choices=choices, low=low, above=above,
                       high=high, below=below, doc=doc)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_META: spec})


def spec_of(field: dataclasses.Field) -> SettingSpec | None:
    return field.metadata.get(_META)


def check(obj: Any) -> None:
    """Check every declared field of the dataclass instance ``obj`` against its annotation and
    bounds (ints become floats where a float is declared, lists tuples); InvalidSetting names the
    field. Config classes call this first in their ``__post_init__``, then check what relates
    several fields."""
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        spec = spec_of(field)
        if spec is None or spec.rest:
            continue
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            continue  # checked when it was built
        checked = _checked(field.name, value, hints[field.name], spec, from_config=False)
        if checked is not value:
            object.__setattr__(obj, field.name, checked)


def read_settings(cls: type[S], tables: Mapping[str, Any]) -> S:
    """Build ``cls`` from a run config's tables (``model``, ``data``, ``hyper``)."""
    tables = {name: tables.get(name) or {} for name in TOP_TABLES}
    claimed: dict[str, set[str]] = {}
    whole: set[str] = set()  # tables read as a whole by a nested dataclass (it checks their keys)
    kwargs = _read_fields(cls, tables, claimed, whole)
    _refuse_unknown(tables, claimed, whole, cls)
    return _construct(cls, kwargs, path="")


def _read_fields(cls: Any, tables: Mapping[str, Any], claimed: dict[str, set[str]], whole: set[str]) -> dict[str, Any]:
    specs = _specs(cls)
    hints = typing.get_type_hints(cls)
    subtables = {spec.table for spec in specs.values() if spec.table}
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        spec = specs[field.name]
        if spec.spread:  # the field's own default (a protocol's batch size, say) under what the tables set
            given = _read_fields(hints[field.name], tables, claimed, whole)
            if field.default_factory is not dataclasses.MISSING:
                base = field.default_factory()
                given = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)} | given
            kwargs[field.name] = _construct(hints[field.name], given, path="")
            continue
        if spec.table is None:
            raise TypeError(f"{cls.__name__}.{field.name}: a field read from a run config needs its table")
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
            table = _table(tables, spec.table or "")
            kwargs[field.name] = {k: v for k, v in table.items() if k not in claimed.get(spec.table or "", set())}
            claimed.setdefault(spec.table or "", set()).update(table)
    return kwargs


def read_table(cls: Any, table: Any, *, path: str) -> Any:
    """A nested dataclass from one whole table: its fields by name, each type-checked."""
    if not isinstance(table, Mapping):
        raise InvalidSetting(f"{path} must be a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in table if k not in fields)
    if unknown:
        raise InvalidSetting(f"{path}: unknown keys {unknown}; known: {sorted(fields)}")
    kwargs = {name: _checked(f"{path}.{name}", table[name], hints[name], spec_of(fields[name]) or SettingSpec())
              for name in fields if name in table}
    return _construct(cls, kwargs, path=path)


def _construct(cls: Any, kwargs: dict[str, Any], *, path: str) -> Any:
    try:
        return cls(**kwargs)
    except (ProtocolError, ValueError, TypeError) as exc:
        if not path or str(exc).startswith(f"{path}."):
            raise InvalidSetting(str(exc)) from exc
        raise InvalidSetting(f"{path}: {exc}") from exc


def _specs(cls: type) -> dict[str, SettingSpec]:
    specs = {}
    for field in dataclasses.fields(cls):
        spec = spec_of(field)
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
            raise InvalidSetting(f"{walked} must be a table, got {table!r}")
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
            raise InvalidSetting(f"{path}: unknown keys {unknown}; known: {sorted(keys)}")
    for top in TOP_TABLES:
        if tables.get(top) and top not in claimed:
            raise InvalidSetting(f"[{top}] is not used by this protocol ({cls.__name__}); remove it")


def _checked(name: str, value: Any, annotation: Any, spec: SettingSpec, *, from_config: bool = True) -> Any:
    value = _typed(name, value, annotation, from_config=from_config)
    if spec.choices is not None and value not in spec.choices:
        raise InvalidSetting(f"{name} {value!r} is not one of {', '.join(map(str, spec.choices))}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if spec.low is not None and not value >= spec.low:
            raise InvalidSetting(f"{name} must be >= {spec.low:g}, got {value}")
        if spec.above is not None and not value > spec.above:
            raise InvalidSetting(f"{name} must be > {spec.above:g}, got {value}")
        if spec.high is not None and not value <= spec.high:
            raise InvalidSetting(f"{name} must be <= {spec.high:g}, got {value}")
        if spec.below is not None and not value < spec.below:
            raise InvalidSetting(f"{name} must be < {spec.below:g}, got {value}")
    return value


def _typed(name: str, value: Any, annotation: Any, *, from_config: bool = True) -> Any:
    """``value`` as the annotation's type, or InvalidSetting naming ``name``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(annotation):
            try:
                return _typed(name, value, option, from_config=from_config)
            except InvalidSetting as exc:
                errors.append(str(exc).split(" must be ", 1)[-1].split(", got")[0])
        wanted = [e for e in errors if "run config can hold" not in e]
        raise InvalidSetting(f"{name} must be {' or '.join(wanted)}, got {value!r}")
    if annotation is Any:
        return value
    if annotation is type(None):
        if value is not None:
            raise InvalidSetting(f"{name} must be none, got {value!r}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise InvalidSetting(f"{name} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSetting(f"{name} must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidSetting(f"{name} must be a finite number, got {value!r}")
        return value if isinstance(value, float) else float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise InvalidSetting(f"{name} must be a string, got {value!r}")
        return value
    if annotation is Path:
        if not isinstance(value, str | PurePath):
            raise InvalidSetting(f"{name} must be a path, got {value!r}")
        return value if isinstance(value, Path) else Path(value)
    if origin is tuple:
        return _tuple(name, value, typing.get_args(annotation), from_config=from_config)
    if origin in (dict, Mapping) or annotation is dict:
        if not isinstance(value, Mapping):
            raise InvalidSetting(f"{name} must be a table, got {value!r}")
        return value if not from_config else dict(value)
    if dataclasses.is_dataclass(annotation):
        if not from_config and isinstance(value, annotation):
            return value
        return read_table(annotation, value, path=name)
    if origin is typing.Literal:
        if value not in typing.get_args(annotation):
            raise InvalidSetting(f"{name} must be one of {list(typing.get_args(annotation))}, got {value!r}")
        return value
    if origin is collections.abc.Callable:  # a predicate (tests, code): not expressible in a run config
        if from_config or not callable(value):
            raise InvalidSetting(f"{name} must be a value a run config can hold, got {value!r}")
        return value
    raise TypeError(f"settings field {name}: annotation {annotation!r} is not supported")


def _tuple(name: str, value: Any, args: tuple[Any, ...], *, from_config: bool) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise InvalidSetting(f"{name} must be a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
        items = tuple(_typed(f"{name}[{i}]", item, args[0], from_config=from_config) for i, item in enumerate(value))
    elif len(value) != len(args):
        raise InvalidSetting(f"{name} must be a list of {len(args)} values, got {value!r}")
    else:
        items = tuple(_typed(f"{name}[{i}]", item, kind, from_config=from_config)
                      for i, (item, kind) in enumerate(zip(value, args, strict=True)))
    return value if isinstance(value, tuple) and items == value and all(
        a is b for a, b in zip(items, value, strict=True)) else items


@dataclasses.dataclass(frozen=True)
class Row:
    """One setting as a reader sees it: where a run config sets it, its type, default, bounds, help."""

    where: str
    type: str
    default: Any
    bounds: str
    doc: str


def describe(cls: type, *, table: str | None = None, base: Any = None) -> list[Row]:
    """Every setting of ``cls`` (nested configs read whole or spread are listed field by field);
    defaults from the instance ``base`` where one is given."""
    rows = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        spec = spec_of(field) or SettingSpec()
        kind = hints[field.name]
        where_table = spec.table or table
        key = field.name if spec.key is None else spec.key
        if spec.spread:
            rows += describe(kind, base=field.default_factory() if field.default_factory is not dataclasses.MISSING
                             else None)
            continue
        if key == "*" and dataclasses.is_dataclass(kind):
            rows += describe(kind, table=where_table)
            continue
        where = (where_table or "") if spec.rest else f"{where_table}.{key}" if where_table else key
        default = getattr(base, field.name) if base is not None else field.default \
            if field.default is not dataclasses.MISSING else (
                field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
        rows.append(Row(where, _type_name(kind), default, spec.bounds(), spec.doc))
    return rows


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) is tuple:
        return "list"
    if typing.get_origin(annotation) in (dict, Mapping) or annotation is dict:
        return "table"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def markdown_table(cls: type) -> str:
    """The settings of ``cls`` as a Markdown table (the protocol READMEs hold it, generated)."""
    lines = ["| setting | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    for row in describe(cls):
        default = "-" if row.default is None else f"`{row.default!r}`".replace("|", "\\|")
        doc = row.doc.replace("|", "\\|").replace("\n", " ")
        kind = row.type.replace("|", "\\|")
        lines.append(f"| `{row.where}` | {kind} | {default} | {row.bounds or '-'} | {doc} |")
    return "\n".join(lines) + "\n"

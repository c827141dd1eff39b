"""Reading a manifest table into a settings dataclass: the one place unknown keys are refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any


def table_kwargs(cls: type, table: object, *, what: str, error: type[Exception]) -> dict[str, Any]:
    """``table`` as keyword arguments for the dataclass ``cls``; ``error`` (naming ``what``) when it
    is not a table or has keys ``cls`` does not know. Values are checked by ``cls`` itself."""
    if not isinstance(table, Mapping):
        raise error(f"{what}: expected a table, got {type(table).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(str(key) for key in table if key not in known)
    if unknown:
        raise error(f"{what}: unknown keys {unknown}; known keys are {sorted(known)}")
    return dict(table)

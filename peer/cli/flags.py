"""argparse flags for every PeerConfig option (hivemind/Petals names and kebab-case aliases), their
help generated from the fields' ``doc``. Secrets (``SECRET_OPTIONS``) are also read from a file
(``--join_token_file PATH``) or the environment (``GOSSAMER_JOIN_TOKEN``), in that order after the
flag, which ``ps`` shows to every user of the host and so logs a warning."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

from gossamer.peer.config import PeerConfig
from gossamer.peer.errors import ConfigError
from gossamer.protocols.core.settings import spec_of

log = logging.getLogger(__name__)

SECRET_OPTIONS = ("join_token", "status_token")
MAX_SECRET_FILE_BYTES = 64 << 10



def add_peer_flags(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """Add ``--name`` and ``--kebab-name`` for every PeerConfig field; defaults are None (= not given)."""
    for field in fields(PeerConfig):
        if field.name in skip:
            continue
        names = [f"--{field.name}"]
        if "_" in field.name:
            names.append(f"--{field.name.replace('_', '-')}")
        kwargs: dict[str, Any] = {"dest": field.name, "default": None, "help": flag_help(field)}
        if isinstance(field.default, bool):
            kwargs["action"] = "store_true"
        elif isinstance(field.default, tuple) or field.name == "roles":
            kwargs["nargs"] = "+"
        elif isinstance(field.default, float):
            kwargs["type"] = float
        elif isinstance(field.default, int):
            kwargs["type"] = int
        elif isinstance(field.default, Path):
            kwargs["type"] = Path
        parser.add_argument(*names, **kwargs)
        if field.name in SECRET_OPTIONS:
            parser.add_argument(f"--{field.name}_file", f"--{field.name.replace('_', '-')}-file",
                                dest=f"{field.name}_file", type=Path, default=None,
                                help=f"read --{field.name} from this file (not visible in `ps`; or set "
                                     f"{secret_variable(field.name)})")


def flag_help(field: Field) -> str:
    """A flag's help: the field's ``doc`` and, where it says something, its default."""
    spec = spec_of(field)
    if spec is None or not spec.doc:
        raise TypeError(f"PeerConfig.{field.name} has no doc, and so its flag no help")
    default = field.default
    if isinstance(default, bool) or default in (None, "", (), 0):
        return spec.doc
    shown = " ".join(default) if isinstance(default, tuple) else default
    return f"{spec.doc} (default {shown})"


def peer_options(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The PeerConfig options given on the command line (None for the ones that were not), the
    secrets among them also from their ``--*_file`` flag or ``environ`` (default ``os.environ``)."""
    names = {f.name for f in fields(PeerConfig)}
    options = {name: getattr(args, name) for name in names if hasattr(args, name)}
    if options.get("roles") is not None:
        options["roles"] = [r for item in options["roles"] for r in item.replace(",", " ").split()]
    for name in SECRET_OPTIONS:
        if hasattr(args, name):
            options[name] = secret_option(name, options.get(name), getattr(args, f"{name}_file", None),
                                          os.environ if environ is None else environ)
    return options


def secret_variable(name: str) -> str:
    """The environment variable a secret option is read from."""
    return f"GOSSAMER_{name.upper()}"


def secret_option(name: str, given: str | None, path: Path | None, environ: Mapping[str, str]) -> str | None:
    """A secret from its flag (with a warning: ``ps`` shows it), its file (surrounding whitespace
    stripped) or its environment variable; None when none gives it; ConfigError for a flag and a
    file at once, or a file that cannot be read."""
    if given is not None and path is not None:
        raise ConfigError(f"give --{name} or --{name}_file, not both")
    if given is not None:
        log.warning("--%s on the command line is visible to every user of this host (ps, /proc); "
                    "use --%s_file or %s instead", name, name, secret_variable(name))
        return given
    if path is not None:
        try:
            with path.expanduser().open("rb") as handle:
                raw = handle.read(MAX_SECRET_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"--{name}_file {path}: {exc.strerror or exc}") from exc
        if len(raw) > MAX_SECRET_FILE_BYTES:
            raise ConfigError(f"--{name}_file {path} is larger than {MAX_SECRET_FILE_BYTES} bytes")
        try:
            return raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--{name}_file {path} is not UTF-8 text") from exc
    value = environ.get(secret_variable(name))
    return value.strip() if value else None

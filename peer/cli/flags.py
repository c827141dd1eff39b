"""argparse flags for every PeerConfig option, with hivemind/Petals names and kebab-case aliases.

Secrets (``SECRET_OPTIONS``: the join token, the status token) are also read from a file
(``--join_token_file PATH``) or the environment (``GOSSAMER_JOIN_TOKEN``), in that order after
the flag itself: a value on the command line is visible to every user of the host in ``ps``, so
giving one there logs a warning.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from gossamer.peer.config import PeerConfig
from gossamer.peer.errors import ConfigError

log = logging.getLogger(__name__)

SECRET_OPTIONS = ("join_token", "status_token")
MAX_SECRET_FILE_BYTES = 64 << 10

_HELP = {
    "identity_path": "Ed25519 identity file (created, mode 0600, if missing)",
    "run": "run id to join, NAME@OWNERPREFIX (the orchestrator prints it)",
    "roles": "roles this peer takes, e.g. learner or node (space or comma separated)",
    "initial_peers": "multiaddrs of running peers, as printed by them (/ip4/.../tcp/.../p2p/...)",
    "new_swarm": "start a new network instead of joining one",
    "host_maddrs": "multiaddrs the DHT node listens on (default /ip4/0.0.0.0/tcp/0)",
    "announce_maddrs": "multiaddrs announced to others (behind NAT / port forwarding)",
    "public_name": "a human-readable name shown in peer tables",
    "host": "address the HTTP and TCP servers bind to (default 0.0.0.0)",
    "announce_host": "address written in this peer's record for HTTP/TCP (default: derived)",
    "http_port": "HTTP port (0: chosen by the OS)",
    "tcp_port": "TCP port (0: chosen by the OS)",
    "announce_http_port": "HTTP port written in this peer's record, when others reach it through another one "
                          "(port forwarding; default: the port it listens on)",
    "announce_tcp_port": "TCP port written in this peer's record (as --announce_http_port)",
    "relay": "volunteer as a relay for peers behind NAT (a public peer only)",
    "relay_port": "port of the relay service (0: chosen by the OS; relayed peers get fresh ports)",
    "relay_max_peers": "most private peers this relay serves at once (default 16)",
    "relay_rate_bytes_per_s": "bytes per second per relayed peer, both ways together (default 0: no cap)",
    "device": "auto (CUDA if present, else CPU), cpu, cuda, cuda:N",
    "data": "dataset: builtin:pydoc or a local file; TL++ nodes: builtin:digits[:shard=K/N|:class=C] or FILE.npz",
    "join_token": "owner-signed join token for allowlist runs (visible in `ps`: prefer --join_token_file or "
                  "GOSSAMER_JOIN_TOKEN)",
    "status_token": "closes /status and /metrics to this host and clients sending Authorization: Bearer "
                    "TOKEN (default: open to anyone; the swarm page reads every peer's /status; visible in `ps`: "
                    "prefer --status_token_file or GOSSAMER_STATUS_TOKEN)",
    "manifest": "use this manifest file instead of fetching it from the DHT (still verified)",
    "checkpoint_dir": "where checkpoints are written and resumed from (default ~/.gossamer/checkpoints)",
    "checkpoint_every": "write a role's state every N rounds (default 10; 0: only on Ctrl+C/SIGTERM and at the end)",
    "threads": "torch CPU threads (0: torch default; 1 when several peers share a host)",
    "attack": "experiments/tests only: make this learner Byzantine, e.g. sign_flip:10",
    "share_log": "TL++ servers: append one JSON line per secret share received to this file (audit aid)",
    "join_timeout_s": "seconds to wait for the run's manifest to appear",
    "events": "print machine-readable JSON events on stdout",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
}


def add_peer_flags(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """Add ``--name`` and ``--kebab-name`` for every PeerConfig field; defaults are None (= not given)."""
    for field in fields(PeerConfig):
        if field.name in skip:
            continue
        names = [f"--{field.name}"]
        if "_" in field.name:
            names.append(f"--{field.name.replace('_', '-')}")
        kwargs: dict[str, Any] = {"dest": field.name, "default": None, "help": _HELP.get(field.name)}
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

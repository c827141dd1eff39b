"""Peer daemon configuration: ``PeerConfig``, one frozen dataclass whose fields declare their
bounds and help (the ``gossamer peer`` flags are generated from them), filled from flags and an
optional TOML file. Names follow hivemind's and Petals' (``--initial_peers``); kebab-case spellings
are accepted too. Precedence: command line > ``-c FILE`` > defaults."""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gossamer.peer.errors import ConfigError
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import check, setting

DEFAULT_IDENTITY = Path("~/.gossamer/identity.pem")
DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    """Everything one peer daemon needs to start; each field's ``doc`` is its flag's help."""

    identity_path: Path = setting(DEFAULT_IDENTITY, doc="Ed25519 identity file (created, mode 0600, if missing)")
    run: str | None = setting(None, doc="run id to join, NAME@OWNERPREFIX (the orchestrator prints it; none for "
                                        "the orchestrator, which makes the run)")
    roles: tuple[str, ...] = setting((), doc="roles this peer takes, e.g. learner or node (space or comma separated)")
    initial_peers: tuple[str, ...] = setting(
        (), doc="multiaddrs of running peers to bootstrap from, as printed by them (/ip4/.../tcp/.../p2p/...)")
    new_swarm: bool = setting(False, doc="start a new network instead of joining one")
    host_maddrs: tuple[str, ...] = setting(("/ip4/0.0.0.0/tcp/0",), doc="multiaddrs the DHT node listens on")
    announce_maddrs: tuple[str, ...] = setting(
        (), doc="multiaddrs the DHT node announces to others (behind NAT / port forwarding)")
    public_name: str = setting("", doc="a human-readable name shown in peer tables (at most 64 characters)")
    host: str = setting("0.0.0.0", doc="address the HTTP and TCP servers bind to")
    announce_host: str = setting("", doc="address written in this peer's record for HTTP/TCP "
                                         "(default: derived from --host and the multiaddrs)")
    http_port: int = setting(0, low=0, high=65535, doc="HTTP port (0: chosen by the OS)")
    tcp_port: int = setting(0, low=0, high=65535, doc="TCP port (0: chosen by the OS)")
    announce_http_port: int = setting(
        0, low=0, high=65535, doc="HTTP port written in this peer's record, when others reach it through another one "
                                  "(a port forward, a WAN-emulating proxy; 0: the port it listens on)")
    announce_tcp_port: int = setting(0, low=0, high=65535,
                                     doc="TCP port written in this peer's record (as --announce_http_port)")
    relay: bool = setting(False, doc="volunteer as a relay for peers behind NAT (a public peer only)")
    relay_port: int = setting(0, low=0, high=65535,
                              doc="port of the relay service (0: chosen by the OS; relayed peers get fresh ports)")
    relay_max_peers: int = setting(16, low=1, doc="most private peers this relay serves at once")
    relay_rate_bytes_per_s: int = setting(16 * 1024 * 1024, low=0,
                                          doc="bytes per second per relayed peer, both ways together (0: no cap)")
    device: str = setting("auto", doc="auto (CUDA if present, else CPU), cpu, cuda, cuda:N or mps")
    data: str = setting("", doc="dataset for data-holding roles: builtin:pydoc or a local file; TL++ nodes: "
                                "builtin:digits[:shard=K/N|:class=C] or FILE.npz")
    join_token: str = setting("", doc="owner-signed join token for allowlist runs (visible in `ps`: prefer "
                                      "--join_token_file or GOSSAMER_JOIN_TOKEN)")
    status_token: str = setting(
        "", doc="closes /status and /metrics to this host and clients sending Authorization: Bearer TOKEN "
                "(default: open to anyone; the swarm page reads every peer's /status; visible in `ps`: prefer "
                "--status_token_file or GOSSAMER_STATUS_TOKEN)")
    manifest: str = setting("", doc="use this manifest file instead of fetching it from the DHT (still verified)")
    checkpoint_dir: Path = setting(Path("~/.gossamer/checkpoints"),
                                   doc="where roles write checkpoints (safetensors, atomically) and resume from")
    checkpoint_every: int = setting(10, low=0, doc="write a role's state every N rounds (0: only on Ctrl+C/SIGTERM "
                                                   "and at the end)")
    threads: int = setting(0, low=0, doc="torch CPU threads (0: torch default; 1 when several peers share a host)")
    attack: str = setting("", doc="experiments/tests only: make this learner Byzantine, e.g. sign_flip:10")
    share_log: str = setting("", doc="TL++ servers: append one JSON line per secret share received to this file "
                                     "(an audit aid)")
    join_timeout_s: float = setting(30.0, above=0, doc="seconds to wait for the run's manifest to appear")
    events: bool = setting(False, doc="print machine-readable JSON events on stdout (gossamer swarm reads them)")
    log_level: str = setting("INFO", doc="DEBUG, INFO, WARNING or ERROR")

    def __post_init__(self) -> None:
        try:
            check(self)
        except InvalidSetting as exc:
            raise ConfigError(str(exc)) from exc
        if self.device.split(":")[0] not in DEVICES:
            raise ConfigError(f"device {self.device!r} is not one of {', '.join(DEVICES)} (optionally cuda:N)")
        _check_ip("host", self.host)
        if self.announce_host:
            _check_ip("announce_host", self.announce_host)
        if self.new_swarm and self.initial_peers:
            raise ConfigError("pass either --new_swarm (start a new network) or --initial_peers (join one), not both")
        if len(self.public_name) > 64:
            raise ConfigError("public_name must be at most 64 characters")

    @property
    def configured_host(self) -> str:
        """The host the flags name for others to connect to ("" when none does: the daemon derives
        it from the swarm, ``peer.run.addresses``)."""
        if self.announce_host:
            return self.announce_host
        if self.host not in ("0.0.0.0", "::"):
            return self.host
        for maddr in (*self.announce_maddrs, *self.host_maddrs):
            parts = maddr.split("/")
            if len(parts) > 2 and parts[1] == "ip4" and parts[2] != "0.0.0.0":
                return parts[2]
        return ""

    @property
    def advertised_host(self) -> str:
        """The host other peers should connect to for HTTP and TCP, from the flags alone."""
        return self.configured_host or "127.0.0.1"


def _check_ip(name: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an IP address, got {value!r}") from exc


def _coerce(name: str, value: Any, default: Any) -> Any:
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of strings, got {value!r}")
        return tuple(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if isinstance(default, Path):
        return Path(str(value)).expanduser()
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


def build_peer_config(file_options: dict[str, Any] | None = None, cli_options: dict[str, Any] | None = None) -> PeerConfig:
    """Merge TOML options and command-line options (None means "not given") into a PeerConfig."""
    known = {f.name: f.default for f in fields(PeerConfig)}
    merged: dict[str, Any] = {}
    for source, options in (("config file", file_options or {}), ("command line", cli_options or {})):
        for raw_name, value in options.items():
            name = raw_name.replace("-", "_")
            if name not in known:
                raise ConfigError(f"unknown option {raw_name!r} in {source}; known: {', '.join(sorted(known))}")
            if value is not None:
                merged[name] = _coerce(name, value, known[name])
    merged.setdefault("identity_path", DEFAULT_IDENTITY.expanduser())
    return PeerConfig(**merged)


def read_toml(path: str | Path, *, what: str) -> dict[str, Any]:
    """Parse a TOML file; ConfigError names ``what`` it is, the file and the problem."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from exc


def load_toml_options(path: str | Path) -> dict[str, Any]:
    """Read ``-c FILE``; a run config's ``[peer]`` table or a flat file of peer options."""
    doc = read_toml(path, what="config file")
    peer = doc.get("peer", doc)
    if not isinstance(peer, dict):
        raise ConfigError(f"config file {path}: [peer] must be a table")
    return {k: v for k, v in peer.items() if not isinstance(v, dict)}

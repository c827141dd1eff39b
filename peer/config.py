"""Peer daemon configuration: one frozen dataclass, filled from flags and an optional TOML file.

Flag names follow hivemind's and Petals' (``--initial_peers``, ``--host_maddrs``, ...); the
kebab-case spellings are accepted too, on the command line and as TOML keys. Precedence: command
line > ``-c FILE`` > defaults.
"""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gossamer.peer.errors import ConfigError

DEFAULT_IDENTITY = Path("~/.gossamer/identity.pem")
DEVICES = ("auto", "cpu", "cuda", "mps")


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    """Everything one peer daemon needs to start.

    Attributes:
        identity_path: Ed25519 identity file (created with mode 0600 if missing).
        run: run id (``name@ownerprefix``) to join; None only for the orchestrator, which makes it.
        roles: roles this peer takes in the run.
        initial_peers: DHT multiaddrs of running peers to bootstrap from.
        new_swarm: start a new DHT network instead of joining one.
        host_maddrs: multiaddrs the DHT node listens on.
        announce_maddrs: multiaddrs the DHT node tells others (behind NAT / port forwarding).
        public_name: a human-readable name shown in peer tables.
        host: address the HTTP and TCP servers bind to.
        announce_host: address written in this peer's record (default: derived from host/maddrs).
        http_port / tcp_port: 0 lets the OS choose.
        announce_http_port / announce_tcp_port: port written in this peer's record when others reach
            it through another one (a port forward, or a WAN-emulating proxy in a benchmark);
            0: the port it listens on.
        relay: volunteer as a relay for private peers (a public peer only; ``peer.reach``).
        relay_port: port of the relay service (0: the OS chooses); relayed peers get fresh ports.
        relay_max_peers: most private peers this relay serves at once.
        relay_rate_bytes_per_s: bytes per second per relayed peer, both ways together (0: no cap).
        device: ``auto`` (CUDA if present, else CPU) or a torch device name.
        data: dataset for data-holding roles (``builtin:pydoc`` or a local path).
        join_token: owner-signed token for runs with an allowlist.
        status_token: a secret that lets remote clients read ``/status`` and ``/metrics``
            (``Authorization: Bearer TOKEN``); with it they answer only this host (loopback) and its
            holders, without it anyone (the swarm page reads every peer's ``/status``).
            Put it in the ``-c`` config file rather than on the command line, where ``ps`` shows it.
        manifest: a manifest file to use instead of fetching it from the DHT (still verified).
        checkpoint_dir: where roles write checkpoints (safetensors, written atomically); a role
            started again with the same identity and directory resumes from its own.
        checkpoint_every: roles holding state write it every this many rounds (0: only on a
            clean shutdown and at the end), besides on Ctrl+C / SIGTERM.
        threads: torch CPU threads for this process (0: torch's default); use 1 when several
            peers share one host.
        attack: for experiments and tests only: make this learner Byzantine (e.g. ``sign_flip:10``).
        share_log: TL++ servers (orchestrator, helper): append one JSON line per secret share
            received to this file ("": off); an audit aid that shows which shares each server held.
        join_timeout_s: how long to wait for the run's manifest to appear in the DHT.
        events: write machine-readable JSON event lines to stdout (used by ``gossamer swarm``).
        log_level: python logging level name.
    """

    identity_path: Path = DEFAULT_IDENTITY
    run: str | None = None
    roles: tuple[str, ...] = ()
    initial_peers: tuple[str, ...] = ()
    new_swarm: bool = False
    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    public_name: str = ""
    host: str = "0.0.0.0"
    announce_host: str = ""
    http_port: int = 0
    tcp_port: int = 0
    announce_http_port: int = 0
    announce_tcp_port: int = 0
    relay: bool = False
    relay_port: int = 0
    relay_max_peers: int = 16
    relay_rate_bytes_per_s: int = 0
    device: str = "auto"
    data: str = ""
    join_token: str = ""
    status_token: str = ""
    manifest: str = ""
    checkpoint_dir: Path = Path("~/.gossamer/checkpoints")
    checkpoint_every: int = 10
    threads: int = 0
    attack: str = ""
    share_log: str = ""
    join_timeout_s: float = 30.0
    events: bool = False
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        for name in ("http_port", "tcp_port", "announce_http_port", "announce_tcp_port", "relay_port"):
            port = getattr(self, name)
            if not isinstance(port, int) or not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be an integer in 0..65535, got {port!r}")
        if not self.join_timeout_s > 0:
            raise ConfigError(f"join_timeout_s must be positive, got {self.join_timeout_s!r}")
        if self.device.split(":")[0] not in DEVICES:
            raise ConfigError(f"device {self.device!r} is not one of {', '.join(DEVICES)} (optionally cuda:N)")
        _check_ip("host", self.host)
        if self.announce_host:
            _check_ip("announce_host", self.announce_host)
        if self.new_swarm and self.initial_peers:
            raise ConfigError("pass either --new_swarm (start a new network) or --initial_peers (join one), not both")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be a non-negative integer, got {self.checkpoint_every!r}")
        if not isinstance(self.relay_max_peers, int) or self.relay_max_peers < 1:
            raise ConfigError(f"relay_max_peers must be a positive integer, got {self.relay_max_peers!r}")
        if not isinstance(self.relay_rate_bytes_per_s, int) or self.relay_rate_bytes_per_s < 0:
            raise ConfigError(f"relay_rate_bytes_per_s must be a non-negative integer, got {self.relay_rate_bytes_per_s!r}")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise ConfigError(f"threads must be a non-negative integer, got {self.threads!r}")
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

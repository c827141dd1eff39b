"""Protocols as plugins: ``ProtocolPlugin`` (a training method's name, settings, roles loaded by
import, commands, events and what the swarm and status views show of it) and ``PluginRegistry``,
which the daemon, the CLI and the swarm read without ever naming a protocol."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.peer.run.records import PeerRecord
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.settings import read_settings

if TYPE_CHECKING:
    from gossamer.peer.config import PeerConfig
    from gossamer.peer.role import Role, RoleContext

S = TypeVar("S")
RoleFactory = Callable[..., "Role"]  # (ctx: RoleContext, **role_options) -> Role
RoleLoader = Callable[[], Mapping[str, RoleFactory]]
"""Imports a protocol's role classes and returns them by role name. A plugin's ``__init__`` names
its roles and gives a loader whose body imports them (real ``import`` statements, run on first
use), so the registry and ``gossamer --help`` import neither torch nor hivemind."""


class CommandKit(Protocol):
    """What the generic CLI lends a plugin's subcommands (so plugins never import the CLI)."""

    def add_peer_flags(self, parser: argparse.ArgumentParser, *, skip: Sequence[str] = ()) -> None:
        """The daemon's flags (``--run``, ``--initial_peers``, ``--device``, ...), and ``-c FILE``."""

    def peer_config(self, args: argparse.Namespace, *, roles: Sequence[str]) -> PeerConfig:
        """``-c FILE`` and the flags as a PeerConfig that takes ``roles`` (plus any ``--roles``)."""

    def run_daemon(self, config: PeerConfig, *, role_options: Mapping[str, Mapping[str, Any]] | None = None) -> int:
        """Run a daemon until Ctrl+C; ``role_options`` are keyword arguments for named roles."""


@dataclass(frozen=True, kw_only=True)
class Command:
    """An extra ``gossamer`` subcommand a plugin brings (``gossamer serve``, ``gossamer helper``)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser, CommandKit], None]
    run: Callable[[argparse.Namespace, CommandKit], int]  # imports what it needs when it runs

    def execute(self, args: argparse.Namespace, kit: CommandKit) -> int:
        return self.run(args, kit)


@dataclass(frozen=True)
class EventSchema:
    """One event a protocol's roles emit (``--events`` JSON lines, as ``"<protocol>.<name>"``):
    what it means and the fields it always carries."""

    doc: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class FinishRule:
    """When a local swarm of this protocol is done: ``event`` seen from every peer (``"peers"``)
    or from the orchestrator (``"owner"``); None: it runs until stopped."""

    event: str
    by: Literal["peers", "owner"]


def _no_description(event: str, fields: Mapping[str, Any]) -> str | None:
    return None


def _no_progress(event: str, fields: Mapping[str, Any]) -> tuple[int, int] | None:
    return None


def _no_panel(records: Sequence[PeerRecord]) -> Panel | None:
    return None


def _no_check(config: RunConfig, num_peers: int, roles: Sequence[str]) -> None:
    return None


def _no_summary(records: Sequence[PeerRecord]) -> list[str]:
    return []


@dataclass(frozen=True)
class Panel:
    """A table a protocol adds to the swarm page (``GET /``), built from the live peers' records:
    e.g. which blocks are covered by which workers and servers."""

    title: str
    columns: tuple[str, ...]
    rows: list[list[Any]]

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns), "rows": self.rows}


@dataclass(frozen=True, kw_only=True)
class ProtocolPlugin:
    """One training method as the network sees it (see the module docstring).

    Attributes:
        name: the value of ``run.protocol`` that selects it.
        summary: one line for ``--help`` texts and the docs.
        settings: a loader of the settings dataclass (``protocols.core.settings.setting`` fields),
            or None.
        roles: the role names (the only place they are spelled).
        load_roles: imports the role classes; role name -> factory ``(ctx, **options) -> Role``.
        owner_roles: roles the run owner's orchestrator takes besides ``orchestrator``.
        swarm_roles: roles the peers of ``gossamer swarm`` take when the run config names none.
        commands: extra ``gossamer`` subcommands.
        events: the events its roles emit, by name (without the protocol prefix).
        finish: when a local swarm is done.
        describe_event: one human line for an event (``gossamer swarm``, a hand-started peer);
            None: the default.
        progress: (done, total) for an event that says how far the run is (a bar and an ETA
            beside its line); None for the others.
        panel: a table for the swarm page from the live peers' records (block coverage, ...).
        swarm_check: refuses (ConfigError) a swarm of ``num_peers`` peers with ``roles`` that
            could not work, before any process starts.
        summarize: extra lines ``gossamer status`` prints about the live peers' records.
    """

    name: str
    summary: str
    settings: Callable[[], type] | None = None
    roles: tuple[str, ...] = ()
    load_roles: RoleLoader = dict
    owner_roles: tuple[str, ...] = ()
    swarm_roles: tuple[str, ...] = ()
    commands: tuple[Command, ...] = ()
    events: Mapping[str, EventSchema] = field(default_factory=dict)
    finish: FinishRule | None = None
    describe_event: Callable[[str, Mapping[str, Any]], str | None] = _no_description
    progress: Callable[[str, Mapping[str, Any]], tuple[int, int] | None] = _no_progress
    panel: Callable[[Sequence[PeerRecord]], Panel | None] = _no_panel
    swarm_check: Callable[[RunConfig, int, Sequence[str]], None] = _no_check
    summarize: Callable[[Sequence[PeerRecord]], list[str]] = _no_summary

    def __post_init__(self) -> None:
        if not isinstance(self.roles, tuple | list) or not all(isinstance(r, str) for r in self.roles):
            raise TypeError(f"plugin {self.name!r}: roles is a tuple of role names (the classes come from "
                            f"load_roles), got {self.roles!r}")
        object.__setattr__(self, "roles", tuple(self.roles))
        object.__setattr__(self, "events", MappingProxyType(dict(self.events)))
        for role in (*self.owner_roles, *self.swarm_roles):
            if role not in self.roles:
                raise ValueError(f"plugin {self.name!r}: role {role!r} is not one of its roles {sorted(self.roles)}")
        if self.finish is not None and self.finish.event not in self.events:
            raise ValueError(f"plugin {self.name!r}: finish event {self.finish.event!r} is not one of its events")

    def read_settings(self, config: RunConfig) -> Any:
        """The run's settings for this protocol (None if it has none); ConfigError names the field."""
        if config.protocol != self.name:
            raise ConfigError(f"run {config.name} uses protocol {config.protocol!r}, not {self.name!r}")
        return None if self.settings is None else run_settings(self.settings(), config)

    def role_factories(self) -> Mapping[str, RoleFactory]:
        """The role classes (imported now); refuses a loader that does not give exactly ``roles``."""
        loaded = dict(self.load_roles())
        if set(loaded) != set(self.roles):
            raise ValueError(f"plugin {self.name!r}: its loader gives roles {sorted(loaded)}, "
                             f"it names {sorted(self.roles)}")
        return loaded


def run_settings(cls: type[S], config: RunConfig) -> S:
    """``cls`` read from a run config's tables; ConfigError names the field at fault."""
    try:
        return read_settings(cls, {"model": config.model, "data": config.data, "hyper": config.hyper})
    except InvalidSetting as exc:
        raise ConfigError(str(exc)) from exc


class PluginRegistry:
    """The protocols one build of gossamer knows, and the generic roles every run has.

    Refuses, when it is built (at import), two plugins with one name, a role name spelled by two
    plugins (or by a plugin and the generic roles), and two commands with one name.
    """

    def __init__(self, *plugins: ProtocolPlugin, generic_roles: Mapping[str, Callable[[], RoleFactory]],
                 reserved_commands: Sequence[str] = ()) -> None:
        self._plugins: dict[str, ProtocolPlugin] = {}
        self._owner: dict[str, str | None] = dict.fromkeys(generic_roles)
        self._generic = MappingProxyType(dict(generic_roles))
        commands = set(reserved_commands)
        for plugin in plugins:
            if plugin.name in self._plugins:
                raise ValueError(f"two plugins are named {plugin.name!r}")
            self._plugins[plugin.name] = plugin
            for role in plugin.roles:
                if role in self._owner:
                    other = self._owner[role] or "the generic roles"
                    raise ValueError(f"role {role!r} is spelled by both {other!r} and {plugin.name!r}")
                self._owner[role] = plugin.name
            for command in plugin.commands:
                if command.name in commands:
                    raise ValueError(f"plugin {plugin.name!r}: command {command.name!r} exists already")
                commands.add(command.name)
        self._plugins_in_order = tuple(plugins)

    def __iter__(self):
        return iter(self._plugins_in_order)

    @property
    def protocols(self) -> tuple[str, ...]:
        return tuple(self._plugins)

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(self._owner)

    def extended(self, *plugins: ProtocolPlugin) -> PluginRegistry:
        """This registry plus ``plugins`` (e.g. a test's own protocol)."""
        return PluginRegistry(*self._plugins_in_order, *plugins, generic_roles=self._generic)

    def plugin(self, protocol: str) -> ProtocolPlugin:
        """The plugin of ``protocol``; ConfigError listing the known ones otherwise."""
        try:
            return self._plugins[protocol]
        except KeyError:
            raise ConfigError(f"run.protocol {protocol!r} is not one this version of gossamer knows: "
                              f"{', '.join(self._plugins)}") from None

    def check_roles(self, protocol: str, roles: Sequence[str], *, run: str = "") -> None:
        """Refuse, in one message, roles that are unknown or belong to another protocol."""
        plugin = self.plugin(protocol)
        for role in roles:
            if role not in self._owner:
                raise ConfigError(f"unknown role {role!r}; a {protocol!r} run has roles: "
                                  f"{', '.join(self.roles_of(protocol))}")
            owner = self._owner[role]
            if owner is not None and owner != plugin.name:
                raise ConfigError(f"role {role!r} belongs to protocol {owner!r}, but run {run or '(this run)'} "
                                  f"uses protocol {protocol!r} (its roles: {', '.join(self.roles_of(protocol))})")

    def roles_of(self, protocol: str) -> tuple[str, ...]:
        return (*self.plugin(protocol).roles, *self._generic)

    def factories(self, protocol: str) -> Mapping[str, RoleFactory]:
        """Every role a peer of a ``protocol`` run may take, by name (imported now)."""
        generic = {name: load() for name, load in self._generic.items()}
        return MappingProxyType({**generic, **self.plugin(protocol).role_factories()})

    def commands(self) -> list[tuple[ProtocolPlugin, Command]]:
        return [(plugin, command) for plugin in self._plugins_in_order for command in plugin.commands]


def build_roles(registry: PluginRegistry, protocol: str, names: Sequence[str], ctx: RoleContext,
                role_options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Role]:
    """Instantiate the named roles of a ``protocol`` run (checked first, all of them at once)."""
    registry.check_roles(protocol, names, run=ctx.manifest.run_id)
    factories = registry.factories(protocol)
    options = role_options or {}
    roles = []
    for name in dict.fromkeys(names):
        try:
            roles.append(factories[name](ctx, **options.get(name, {})))
        except InvalidSetting as exc:  # e.g. a --data file that cannot be read: one line, no traceback
            raise ConfigError(f"role {name}: {exc}") from exc
    return roles

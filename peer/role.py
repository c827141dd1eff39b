"""Pluggable roles: what a peer does in a run.

A role is built from a ``RoleContext`` by a factory registered in ``peer.roles``; the daemon
collects its HTTP routes and TCP methods before the servers start, then calls ``start()``; on
shutdown it calls ``aclose()`` (idempotent). ``status()`` feeds ``/status``, ``/metrics`` and the
swarm view. Later protocols add their roles (learner, block-worker, block-server, expert-host,
cp-shard, node, helper) to the registry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from aiohttp import web

from gossamer.crypto.identity import Identity
from gossamer.peer.config import PeerConfig
from gossamer.peer.errors import ConfigError
from gossamer.peer.metrics import Traffic
from gossamer.peer.run.manifest import Manifest
from gossamer.peer.run.view import PeerView
from gossamer.transport.dht import DhtMembership
from gossamer.transport.errors import TransportError
from gossamer.transport.frames import Frame
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient

log = logging.getLogger(__name__)

TcpMethod = Callable[[Frame], Awaitable[Frame | None]]
RoleFactory = Callable[["RoleContext"], "Role"]


@dataclass(frozen=True, kw_only=True)
class RoleContext:
    """What the daemon hands every role: identity, run, device, and the shared transports."""

    identity: Identity
    config: PeerConfig
    manifest: Manifest
    membership: DhtMembership
    http_client: HttpClient
    view: PeerView
    device: torch.device
    traffic: Traffic
    now: Callable[[], float]
    http_config: HttpConfig
    announce: Callable[[], None] = lambda: None  # republish this peer's record now (e.g. a new round)
    view_refreshed: asyncio.Condition = field(default_factory=asyncio.Condition)  # notified after each refresh

    async def until_view(self, predicate: Callable[[], bool], *, timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds after a view refresh (or already holds); False at the timeout."""
        async with self.view_refreshed:
            try:
                await asyncio.wait_for(self.view_refreshed.wait_for(predicate), timeout=max(0.0, timeout_s))
            except TimeoutError:
                return predicate()
        return True


class Role:
    """Base class with the no-op defaults; subclasses override what they need."""

    name = "role"

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx
        self._task: asyncio.Task[None] | None = None  # the role's main loop, if it has one

    def routes(self) -> list[web.RouteDef]:
        return []

    def tcp_methods(self) -> dict[str, TcpMethod]:
        return {}

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        await self.stop_task()

    async def stop_task(self) -> None:
        """Cancel the role's main loop (``self._task``) and wait until it has ended."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def round(self) -> int:
        return 0

    def gauges(self) -> dict[str, float]:
        """Extra numbers for ``/metrics`` (exported as ``gossamer_<name>``)."""
        return {}

    def model_state(self) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        """(version, tensors) of a replicated model this role holds, served to joiners; None if none."""
        return None

    def status(self) -> dict[str, Any]:
        return {}


def manifest_key(run_id: str) -> str:
    return f"run/{run_id}/manifest"


def peers_key(run_id: str) -> str:
    return f"run/{run_id}/peers"


class OrchestratorRole(Role):
    """Publishes the owner-signed manifest in the DHT (refreshed every heartbeat) and over HTTP."""

    name = "orchestrator"

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        if ctx.manifest.owner_public_key != ctx.identity.public_key:
            raise ConfigError("the orchestrator role needs the run owner's identity (the key that signed the manifest)")
        self.publications = 0

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/manifest", self._serve_manifest)]

    async def _serve_manifest(self, request: web.Request) -> web.Response:
        return web.Response(body=self.ctx.manifest.blob, content_type="application/octet-stream")

    async def start(self) -> None:
        await self.publish_once()
        self._task = asyncio.create_task(self._publish_loop(), name="orchestrator-manifest")

    async def publish_once(self) -> None:
        expiration = self.ctx.now() + self.ctx.manifest.ttl_s
        await self.ctx.membership.store(manifest_key(self.ctx.manifest.run_id), self.ctx.identity.peer_id,
                                        self.ctx.manifest.blob, expiration_time=expiration)
        self.publications += 1

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.manifest.config.heartbeat_s)
            try:
                await self.publish_once()
            except TransportError as exc:
                log.warning("could not republish the manifest: %s", exc)

    def status(self) -> dict[str, Any]:
        return {"run_id": self.ctx.manifest.run_id, "protocol": self.ctx.manifest.config.protocol,
                "manifest_publications": self.publications}


KNOWN_ROLES = ("learner", "block-worker", "block-server", "block-coordinator", "expert-host", "cp-shard",
               "node", "orchestrator", "helper", "tlpp-server", "ar-stage")


def build_roles(names: tuple[str, ...], ctx: RoleContext, factories: Mapping[str, RoleFactory]) -> list[Role]:
    """Instantiate the named roles; ConfigError for names that are unknown or not available yet."""
    roles = []
    for name in dict.fromkeys(names):
        if name not in factories and name not in KNOWN_ROLES:
            raise ConfigError(f"unknown role {name!r}; roles are: {', '.join(KNOWN_ROLES)}")
        if name not in factories:
            raise ConfigError(f"role {name!r} is not available in this version of gossamer "
                              f"(available: {', '.join(factories)})")
        roles.append(factories[name](ctx))
    return roles

"""Role ``orchestrator``: the run owner's peer. Generic: every run has one, whatever its protocol.

It publishes the owner-signed manifest in the DHT (refreshed every heartbeat; a failed store is
an alarm and is retried after a quarter heartbeat, ``run.publisher``) and serves it over HTTP;
the protocol's own run-owner roles (``ProtocolPlugin.owner_roles``) come beside it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gossamer.peer.errors import ConfigError
from gossamer.peer.role import Role, RoleContext
from gossamer.peer.run.keys import manifest_key
from gossamer.peer.run.publisher import Publisher


class OrchestratorRole(Role):
    """Publishes the owner-signed manifest in the DHT (refreshed every heartbeat) and over HTTP."""

    name = "orchestrator"

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        if not ctx.is_run_owner:
            raise ConfigError("the orchestrator role needs the run owner's identity (the key that signed the manifest)")
        self.publisher = Publisher(ctx.membership, what="manifest", key=manifest_key(ctx.manifest.run_id),
                                   signer=ctx.identity, heartbeat_s=ctx.manifest.config.heartbeat_s,
                                   store_log=ctx.store_log)

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/manifest", self._serve_manifest)]

    async def _serve_manifest(self, request: web.Request) -> web.Response:
        return web.Response(body=self.ctx.manifest.blob, content_type="application/octet-stream")

    async def start(self) -> None:
        await self.publish_once()
        self.spawn(self._publish_loop(), name="manifest")

    async def publish_once(self) -> bool:
        """Store the manifest until a TTL from now; False (and the alarm raised) if no node took it."""
        return await self.publisher.publish(self.ctx.manifest.blob,
                                            expiration_time=self.ctx.now() + self.ctx.manifest.ttl_s)

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.publisher.retry_delay_s)
            await self.publish_once()

    def status(self) -> dict[str, Any]:
        return {"run_id": self.ctx.manifest.run_id, "protocol": self.ctx.manifest.config.protocol,
                "manifest_publications": self.ctx.store_log.stored["manifest"],
                "manifest_store_failures": self.ctx.store_log.failed["manifest"]}

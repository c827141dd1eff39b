"""Role ``orchestrator``: the run owner's peer, whatever the protocol. It keeps the owner-signed
manifest in the DHT, serves it over HTTP (``GET /manifest``), serves until stopped, and announces
in ``run_round`` the highest round the run's steering members reached (README.md of peer)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from aiohttp import web

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.conditions import wait_notified
from gossamer.peer.role import Role, RoleContext
from gossamer.peer.run.keys import manifest_key
from gossamer.peer.run.publisher import Publisher
from gossamer.peer.run.tenure import steering


class OrchestratorRole(Role):
    """Publishes the owner-signed manifest in the DHT (refreshed every heartbeat) and over HTTP."""

    name = "orchestrator"
    ends = False

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        if not ctx.is_run_owner:
            raise ConfigError("the orchestrator role needs the run owner's identity (the key that signed the manifest)")
        self.publisher = Publisher(ctx.membership, what="manifest", key=manifest_key(ctx.manifest.run_id),
                                   signer=ctx.identity, heartbeat_s=ctx.manifest.config.heartbeat_s,
                                   store_log=ctx.store_log)
        self.highest_round = 0

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/manifest", self._serve_manifest)]

    async def _serve_manifest(self, request: web.Request) -> web.Response:
        manifest = self.ctx.manifest
        if request.rel_url.query.get("format") == "signed":
            return web.Response(body=manifest.blob, content_type="application/octet-stream")
        config = manifest.config
        return web.json_response({
            "run_id": manifest.run_id, "owner_peer_id": manifest.owner_peer_id,
            "owner_public_key": manifest.owner_public_key.hex(), "created_at": manifest.created_at,
            "run": {"name": config.name, "protocol": config.protocol, "description": config.description,
                    "heartbeat_s": config.heartbeat_s},
            "model": config.model, "data": config.data, "hyper": config.hyper,
            "admission": {"policy": config.policy, "allow": list(config.allow)},
            "signed_base64": base64.b64encode(manifest.blob).decode("ascii"),
        })

    async def start(self) -> None:
        await self.publish_once()
        self.spawn(self._publish_loop(), name="manifest")
        self.spawn(self._follow_rounds(), name="rounds")

    @property
    def run_round(self) -> int:
        return self.highest_round

    async def _follow_rounds(self) -> None:
        while True:
            if self.note_rounds():
                self.ctx.announce()
            await wait_notified(self.ctx.view_refreshed, timeout_s=self.ctx.manifest.config.heartbeat_s)

    def note_rounds(self) -> bool:
        """Raise ``highest_round`` to what the steering members announce now; True if it rose."""
        now, me = self.ctx.now(), self.ctx.identity.peer_id
        members = [p for p in self.ctx.view.live(now=now) if p.record.peer_id != me]
        rounds = [p.record.round for p in steering(members, now=now, tenure_s=self.ctx.manifest.tenure_s, owner=None)]
        if max(rounds, default=0) <= self.highest_round:
            return False
        self.highest_round = max(rounds)
        return True

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
                "manifest_store_failures": self.ctx.store_log.failed["manifest"], "run_round": self.highest_round}

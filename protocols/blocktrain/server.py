"""Role ``block-server`` (``gossamer serve``): downloads some blocks' current versions (and E) from the
coordinator, announces them in its record (how clients find routes), answers route frames with
them (``BlockHost``) and swaps in newer versions as they close; passes in flight finish on the
stack they started with."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gossamer.peer.errors import ConfigError
from gossamer.peer.role import ProtocolRole, RoleContext, TcpGate, TcpMethod, payload_cap
from gossamer.peer.route.policy import live_hop_policy
from gossamer.peer.route.pool import HopPool
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.blocktrain import names
from gossamer.protocols.blocktrain.core import BlockStack, BlockTrainError
from gossamer.protocols.blocktrain.fetch import fetch_block, find_coordinator, live_coordinator
from gossamer.protocols.blocktrain.host import EMBEDDING_METHOD, METHOD, BlockHost, max_route_payload_bytes
from gossamer.protocols.blocktrain.settings import BlockTrainSettings
from gossamer.protocols.blocktrain.stack import partial_stack
from gossamer.transport.errors import TransportError
from gossamer.transport.frames import Frame
from gossamer.transport.tcp import ConnectionInfo, HandlerError

log = logging.getLogger(__name__)


class BlockServerRole(ProtocolRole[BlockTrainSettings]):
    """Serves ``blocks`` (default: every block of the run) at the coordinator's newest versions."""

    name = names.SERVER
    ends = False  # serves blocks until stopped

    def __init__(self, ctx: RoleContext, *, blocks: tuple[int, ...] | None = None,
                 refresh_s: float | None = None) -> None:
        super().__init__(ctx)
        self.refresh_s = refresh_s or ctx.manifest.config.heartbeat_s  # how often it asks for new versions
        num_blocks = self.settings.model.num_blocks
        chosen = tuple(range(num_blocks)) if blocks is None else tuple(dict.fromkeys(blocks))
        if not chosen or any(not 0 <= k < num_blocks for k in chosen):
            raise ConfigError(f"--blocks {list(blocks or ())}: the run has blocks 0..{num_blocks - 1}")
        self.blocks = tuple(sorted(chosen, reverse=True))  # applied from the highest noise band down
        self.versions: dict[int, int] = {}
        self.pool = HopPool()
        self.host: BlockHost | None = None

    def tcp_methods(self) -> dict[str, TcpMethod]:
        return {METHOD: self._denoise_pass, EMBEDDING_METHOD: self._embedding}

    def tcp_gates(self) -> dict[str, TcpGate]:
        cap = max_route_payload_bytes(self.settings.model, self.settings.max_batch)
        return {METHOD: payload_cap(cap, METHOD), EMBEDDING_METHOD: payload_cap(0, EMBEDDING_METHOD)}

    async def start(self) -> None:
        self.spawn(self._serve(), name="serving")

    async def aclose(self) -> None:
        await super().aclose()
        await self.pool.aclose()

    def status(self) -> dict[str, Any]:
        if self.host is None:
            return {"loading": list(self.blocks)}
        versions = {str(k): v for k, v in self.versions.items()}
        return {"assignment": {"blocks": list(self.blocks), "block_versions": versions},
                "passes": self.host.served, "refused": self.host.refused}

    def gauges(self) -> dict[str, float]:
        return {"block_server_passes": float(self.host.served)} if self.host else {}

    # -- TCP ------------------------------------------------------------------------------------

    async def _denoise_pass(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        if self.host is None:
            raise HandlerError("this block server is still loading its blocks")
        await self.ctx.fault_point("pass", self.serving_version)  # a test's crash or stall, a pass in hand
        return await self.host.handle(frame)

    @property
    def serving_version(self) -> int:
        """The version it serves: the oldest of its blocks' (-1 while loading)."""
        return min(self.versions.values(), default=-1)

    async def _embedding(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        if self.host is None:
            raise HandlerError("this block server is still loading its blocks")
        return self.host.embedding_frame()

    # -- loading ----------------------------------------------------------------------------------

    async def _serve(self) -> None:
        """Load the blocks (retrying until the coordinator serves them), announce them, then keep
        them at the coordinator's newest versions."""
        while self.host is None:
            coordinator = await find_coordinator(self.ctx, timeout_s=self.ctx.config.join_timeout_s)
            if coordinator is None:
                log.warning("no block coordinator of run %s is live; it serves the blocks "
                            "(is the orchestrator up?)", self.ctx.manifest.run_id)
                continue
            try:
                stack = await self._download(coordinator)
            except (TransportError, BlockTrainError) as exc:
                log.warning("could not download the blocks from the coordinator, retrying: %s", exc)
                await asyncio.sleep(self.ctx.manifest.config.heartbeat_s)
                continue
            self.host = BlockHost(stack, self.blocks, run_id=self.ctx.manifest.run_id, pool=self.pool,
                                  next_hop_ok=live_hop_policy(self.ctx, role=names.SERVER, key="blocks"),
                                  max_batch=self.settings.max_batch)
        self.ctx.announce()
        self.emit("serving", blocks=list(self.blocks), versions=self.versions)
        log.info("serving blocks %s at versions %s", list(self.blocks), self.versions)
        await self._refresh_loop()

    async def _download(self, coordinator: LivePeer) -> BlockStack:
        """A stack of the coordinator's current versions of the blocks (each version it moves past
        is a fault point ``load``: downloaded, not yet served)."""
        stack = partial_stack(self.settings.model, self.blocks, device=self.ctx.device)
        versions = {}
        for k in self.blocks:
            fetched = await fetch_block(self.ctx.http_client, coordinator, k)
            stack.load_block_state(k, fetched.tensors)
            stack.load_embedding_state(fetched.embedding)
            versions[k] = fetched.version
        stack.eval()
        for version in range(self.serving_version + 1, min(versions.values()) + 1):
            await self.ctx.fault_point("load", version)  # a test's crash before it serves that version
        self.versions = versions
        return stack

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            coordinator = live_coordinator(self.ctx)
            if coordinator is None or self.host is None:
                continue
            try:
                url = f"http://{coordinator.record.http_addr}/blocktrain/state"
                state = await self.ctx.http_client.get_json(url)
                current = [int(v) for v in state.get("versions", [])]
                if all(k < len(current) and current[k] == self.versions.get(k) for k in self.blocks):
                    continue
                self.host.stack = await self._download(coordinator)
            except (TransportError, BlockTrainError, ValueError, TypeError) as exc:
                log.warning("could not refresh the served blocks: %s", exc)
                continue
            self.ctx.announce()
            self.emit("serving", blocks=list(self.blocks), versions=self.versions)

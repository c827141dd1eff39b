"""A cp-shard's state outside a step: downloading the ring's (a joiner placed by a plan, a shard
that fell behind), and the checkpoint a restart resumes from.

A plan that places a shard one or more steps behind (or at its step with another state: a ring
that trained apart) names the leader's state digest; the shard downloads that state from the
leader and checks it against the digest before it accepts.
``catch_up`` downloads from every live shard ahead of this one (``kit.state_join``). The
resumable state is the model, its AdamW moments and the version, as of the last applied step
(``Replica.model_state``): written on a clean shutdown and every ``--checkpoint_every`` steps,
read back when the shard starts again with the same identity and checkpoint folder; a ring that
moved on meanwhile is caught up with at once, one that was stopped with it goes on from there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.download_events import downloading_fields
from gossamer.peer.kit.state_join import download_state
from gossamer.peer.kit.state_tree import resume_state, write_state
from gossamer.peer.kit.statesync import (
    Donor,
    DownloadProgress,
    StateSyncError,
    fetch_state,
    index_digest,
    state_index,
)
from gossamer.protocols.context import names
from gossamer.protocols.context.replica import Replica, StateMismatch

if TYPE_CHECKING:
    from gossamer.peer.kit.checkpoint import Checkpoints
    from gossamer.peer.role import RoleContext
    from gossamer.peer.run.view import LivePeer
    from gossamer.protocols.context.settings import ContextSettings
    from gossamer.protocols.context.wire import Plan

log = logging.getLogger(__name__)


class StateKeeper:
    """The state side of ``CpShardRole`` (a mixin: the role holds the state named below)."""

    if TYPE_CHECKING:
        ctx: RoleContext
        settings: ContextSettings
        peer_id: str
        replica: Replica
        checkpoints: Checkpoints
        _state_lock: asyncio.Lock
        _synced: set[str]
        _digest: tuple[int, str] | None
        _checkpointed: int
        _stepped: asyncio.Condition

        def emit(self, event: str, **fields: Any) -> None: ...
        def peers_with(self, role: str, *, include_self: bool = False) -> list[LivePeer]: ...
        def live_with(self, peer_id: str, role: str) -> LivePeer | None: ...

    async def _download(self, plan: Plan) -> None:
        """The leader's state at the plan's step, checked against the digest its signed plan names."""
        assert plan.state is not None
        live = self.live_with(plan.leader, names.SHARD)
        if live is None:
            raise StateSyncError("the plan's leader is not live", failures=())
        async with self._state_lock:
            tensors, report = await fetch_state(self.ctx.http_client, [Donor(plan.leader, live.record.http_addr)],
                                                version=plan.step, digest=plan.state[1], joiner_id=self.peer_id,
                                                timeout_s=self.settings.plan_timeout_s, progress=self._downloading)
            await self._adopt(plan.step, tensors, donors=len(report.shards_served), why="placed in the ring")

    async def catch_up(self, *, why: str) -> None:
        """Download the state of the live shards when their records are ahead of this one."""
        others = self.peers_with(names.SHARD)
        if self._state_lock.locked() or not any(p.record.round > self.replica.version for p in others):
            return
        async with self._state_lock:
            try:
                version, tensors, report = await download_state(self.ctx.http_client, others, joiner_id=self.peer_id,
                                                                timeout_s=self.settings.plan_timeout_s,
                                                                progress=self._downloading)
                if version > self.replica.version:
                    await self._adopt(version, tensors, donors=len(report.shards_served), why=why)
            except (StateSyncError, StateMismatch) as exc:
                log.warning("could not catch up with the ring (%s): %s", why, exc)

    def _downloading(self, progress: DownloadProgress) -> None:
        self.emit("downloading", **downloading_fields(progress))

    async def _adopt(self, version: int, tensors: Mapping[str, torch.Tensor], *, donors: int, why: str) -> None:
        self.replica.adopt(version, tensors)
        self._synced = {self.peer_id}
        self.ctx.announce()
        self.emit("adopted", step=version, donors=donors, why=why)
        log.info("%s: now at step %d (state from %d donor(s))", why, version, donors)
        await self.stepped()

    async def _state_digest(self) -> str:
        version, tensors = self.replica.model_state()
        if self._digest is None or self._digest[0] != version:
            digest = await asyncio.to_thread(lambda: index_digest(state_index(version, tensors)))
            self._digest = (version, digest)
        return self._digest[1]

    async def stepped(self) -> None:
        """The model moved to a new version (a step, or an adopted state): wake ``until_step``
        waiters, and write the checkpoint every ``--checkpoint_every`` steps."""
        async with self._stepped:
            self._stepped.notify_all()
        every, version = self.ctx.config.checkpoint_every, self.replica.version
        if every and version % every == 0 and version != self._checkpointed:
            await self.checkpoint()

    # -- what a restart resumes from ----------------------------------------------------------------

    def _state_name(self) -> str:
        return f"{self.ctx.manifest.config.name}-{self.peer_id[:12]}-state"

    async def checkpoint(self) -> str | None:
        """Write the state of the last applied step (model, AdamW moments, version)."""
        version, tensors = self.replica.model_state()
        self._checkpointed = version
        return await write_state(self.checkpoints, self._state_name(), {"version": version, "state": dict(tensors)},
                                 step=str(version))

    def resume(self) -> str:
        """Load the state an earlier life of this shard wrote; its path, or "" when there is none."""
        def apply(tree: dict[str, Any]) -> None:
            try:
                self.replica.adopt(int(tree["version"]), tree["state"])
            except StateMismatch as exc:
                raise ConfigError(str(exc)) from exc

        path = resume_state(self.checkpoints, self._state_name(), apply)
        if path:
            log.info("resumed from %s at step %d", path, self.replica.version)
        return path

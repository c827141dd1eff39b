"""``StateKeeper``: a cp-shard's model state outside a step. It downloads the ring's state (a plan
that places it behind, or a ring that moved on), knows which peers hold the same state, and
writes what a restart resumes from (model, AdamW moments, version of the last applied step)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.conditions import wait_until
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
from gossamer.peer.role import RoleContext
from gossamer.protocols.context.membership import Ring
from gossamer.protocols.context.replica import MODEL, Replica, StateMismatch
from gossamer.protocols.context.settings import ContextSettings
from gossamer.protocols.context.wire import Plan

log = logging.getLogger(__name__)


class StateKeeper:
    """The replica's state between steps: downloads, its digest, who shares it, its checkpoints."""

    def __init__(self, ctx: RoleContext, settings: ContextSettings, replica: Replica, ring: Ring, *,
                 emit: Callable[..., None]) -> None:
        self.ctx = ctx
        self.settings = settings
        self.replica = replica
        self.ring = ring
        self.checkpoints = Checkpoints(ctx.config.checkpoint_dir, run_id=ctx.manifest.run_id, format="gossamer/context")
        self._emit = emit
        self._lock = asyncio.Lock()  # held while a downloaded state is fetched and adopted
        self._shared_with: set[str] = {ring.me}  # peers known to hold this very state
        self._digest: tuple[int, str] | None = None
        self._checkpointed = -1  # the version the last checkpoint holds
        self._stepped = asyncio.Condition()

    @property
    def busy(self) -> bool:
        """Whether a downloaded state is being fetched and adopted now."""
        return self._lock.locked()

    # -- who holds this state ---------------------------------------------------------------------

    def shared_by(self, members: tuple[str, ...] | list[str]) -> bool:
        """Whether every one of ``members`` is known to hold this shard's state."""
        return set(members) <= self._shared_with

    def shared_with(self, members: tuple[str, ...]) -> None:
        """``members`` applied the same update as this shard (the leader's, just now)."""
        self._shared_with = set(members)

    def not_shared_with(self, member: str) -> None:
        """``member`` may not hold this state (it missed an update, or says it is behind)."""
        self._shared_with.discard(member)

    # -- downloads ------------------------------------------------------------------------------

    async def download(self, plan: Plan) -> None:
        """The leader's state at the plan's step, checked against the digest its signed plan names."""
        assert plan.state is not None
        live = self.ring.live(plan.leader)
        if live is None:
            raise StateSyncError("the plan's leader is not live", failures=())
        async with self._lock:
            tensors, report = await fetch_state(self.ctx.http_client, [Donor(plan.leader, live.record.http_addr)],
                                                version=plan.step, digest=plan.state[1], joiner_id=self.ring.me,
                                                timeout_s=self.settings.plan_timeout_s, progress=self._downloading)
            await self._adopt(plan.step, tensors, donors=len(report.shards_served), why="placed in the ring")

    async def catch_up(self, *, why: str) -> None:
        """Download the state of the live shards when their records are ahead of this one."""
        others = self.ring.shards()
        if self._lock.locked() or not any(p.record.round > self.replica.version for p in others):
            return
        async with self._lock:
            try:
                version, tensors, report = await download_state(self.ctx.http_client, others, joiner_id=self.ring.me,
                                                                timeout_s=self.settings.plan_timeout_s,
                                                                progress=self._downloading)
                if version > self.replica.version:
                    await self._adopt(version, tensors, donors=len(report.shards_served), why=why)
            except (StateSyncError, StateMismatch) as exc:
                log.warning("could not catch up with the ring (%s): %s", why, exc)

    def _downloading(self, progress: DownloadProgress) -> None:
        self._emit("downloading", **downloading_fields(progress))

    async def _adopt(self, version: int, tensors: Mapping[str, torch.Tensor], *, donors: int, why: str) -> None:
        self.replica.adopt(version, tensors)
        self._shared_with = {self.ring.me}
        self.ctx.announce()
        self._emit("adopted", step=version, donors=donors, why=why)
        log.info("%s: now at step %d (state from %d donor(s))", why, version, donors)
        await self.stepped()

    async def digest(self) -> str:
        """The digest of this shard's state (what a plan names for a member that must download it)."""
        version, tensors = self.replica.model_state()
        if self._digest is None or self._digest[0] != version:
            digest = await asyncio.to_thread(lambda: index_digest(state_index(version, tensors)))
            self._digest = (version, digest)
        return self._digest[1]

    # -- new versions -----------------------------------------------------------------------------

    async def stepped(self) -> None:
        """The model moved to a new version (a step, or an adopted state): wake ``until_step``
        waiters, and write the checkpoint every ``--checkpoint_every`` steps."""
        async with self._stepped:
            self._stepped.notify_all()
        every, version = self.ctx.config.checkpoint_every, self.replica.version
        if every and version % every == 0 and version != self._checkpointed:
            await self.checkpoint()

    async def until_step(self, step: int, *, timeout_s: float) -> bool:
        """Wait until the model is at ``step`` or later (False at the timeout)."""
        return await wait_until(self._stepped, lambda: self.replica.version >= step, timeout_s=timeout_s)

    # -- files ----------------------------------------------------------------------------------

    def _state_name(self) -> str:
        return f"{self.ctx.manifest.config.name}-{self.ring.me[:12]}-state"

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

    async def write_model(self) -> str:
        """The model's parameters as of the last applied step, as a checkpoint to use (not to resume)."""
        version, tensors = self.replica.model_state()
        params = {name.removeprefix(MODEL): t for name, t in tensors.items() if name.startswith(MODEL)}
        name = f"{self.ctx.manifest.config.name}-{self.ring.me[:12]}-step{version}"
        return str(await self.checkpoints.write_async(name, params, step=str(version)))

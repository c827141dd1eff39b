"""Role ``block-worker``: trains the block the coordinator assigns, K local steps at a time, and sends
the signed difference against the version it fetched. It holds only that block and its AdamW state
(kept across the block's versions, dropped when it is moved); its checkpoint takes them back after
a restart. One cycle step by step: ``protocols/blocktrain/README.md``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.messaging import SignedMessenger
from gossamer.peer.kit.state_tree import resume_state, snapshot, write_state
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.blocktrain import names
from gossamer.protocols.blocktrain.core import BlockTrainError, block_parameters, train_step
from gossamer.protocols.blocktrain.fetch import BlockVersion, fetch_block, find_coordinator
from gossamer.protocols.blocktrain.settings import BlockTrainSettings
from gossamer.protocols.blocktrain.stack import hold_block, pack, partial_stack, release_block
from gossamer.protocols.core.text_data import BatchSampler, load_text, shard, split_text
from gossamer.transport.errors import TransportError

log = logging.getLogger(__name__)
RETRY_S = 1.0
LONG_POLL_S = 10.0


class BlockWorkerRole(ProtocolRole[BlockTrainSettings]):
    """Fetch the assigned block, train K steps, send the signed difference; again until the run is finished."""

    name = names.WORKER

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        config = self.settings.model
        train = split_text(load_text(ctx.config.data or self.settings.text.data_source),
                           heldout_fraction=self.settings.text.heldout_fraction).train
        self.shard = self.shard_index(self.settings.text.num_shards)
        seed = self.peer_seed()
        self.sampler = BatchSampler(shard(train, index=self.shard, count=self.settings.text.num_shards),
                                    batch_size=self.settings.text.batch_size, context=config.context,
                                    generator=torch.Generator().manual_seed(seed))
        self.noise = torch.Generator(device=ctx.device).manual_seed(seed + 1)
        self.messenger = SignedMessenger(identity=ctx.identity, run_id=ctx.manifest.run_id, client=ctx.http_client,
                                         view=ctx.view, now=ctx.now, limits=ctx.http_config.limits,
                                         max_body_bytes=ctx.http_config.max_body_bytes)
        self.stack = partial_stack(config, [], device=ctx.device)
        self.block: int | None = None
        self.version: int | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.updates = {"sent": 0, "accepted": 0, "refused": 0}
        self.last_reason: str | None = None
        self._wait_past: tuple[int, int] | None = None  # (block, version) whose next version it polls for
        self.finished = False
        self.checkpoints = Checkpoints(ctx.config.checkpoint_dir, run_id=ctx.manifest.run_id,
                                       format="gossamer/blocktrain-worker")
        self._saved_optimizer: tuple[int, dict[str, Any]] | None = None
        self.resumed_from = self._resume()
        self._boundary = self._cycle_state()

    # -- role interface -------------------------------------------------------------------------

    async def start(self) -> None:
        self.spawn(self._run(), name="cycles")

    @property
    def round(self) -> int:
        return self.version or 0

    def status(self) -> dict[str, Any]:
        return {"assignment": {"block": self.block} if self.block is not None else {},
                "version": self.version, "shard": self.shard, "updates": dict(self.updates),
                "last_refusal": self.last_reason, "finished": self.finished}

    def health(self) -> RoleHealth:
        health = super().health()
        if health.state != FAILED and self.finished:
            return RoleHealth(FINISHED, f"the run is finished; updates {self.updates}")
        return health

    # -- the cycle ------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            coordinator = await self._coordinator()
            url = f"http://{coordinator.record.http_addr}/blocktrain/state"
            if self._wait_past is not None:
                block, version = self._wait_past
                wait_s = min(LONG_POLL_S, self.settings.deadline_s)  # a version closes by its deadline
                url += f"?block={block}&after={version}&wait_s={wait_s}&worker={self.peer_id}"  # the next version
            try:
                state = await self.ctx.http_client.get_json(url)
                if state.get("finished"):
                    break
                block = state.get("assignment", {}).get(self.ctx.identity.peer_id)
                if block is None:
                    await asyncio.sleep(RETRY_S)  # not in the coordinator's view yet: poll again
                    continue
                block, arrived = int(block), state.get("arrived") or []
                if block < len(arrived) and self.peer_id in arrived[block]:
                    self._wait_past = (block, int(state["versions"][block]))  # it has this version's update
                    continue
                await self._cycle(coordinator, block)
            except (TransportError, BlockTrainError, ValueError) as exc:
                log.warning("block worker cycle failed, retrying in %.0f s: %s", RETRY_S, exc)
                self.emit("error", error=str(exc)[:300])
                await asyncio.sleep(RETRY_S)
        self.finished = True
        self._switch(None)
        self.emit("worker_finished", updates=dict(self.updates))
        log.info("the run is finished; %s", self.updates)

    async def _coordinator(self) -> LivePeer:
        while (found := await find_coordinator(self.ctx, timeout_s=10.0)) is None:
            log.info("waiting for the block coordinator to appear")
        return found

    async def _cycle(self, coordinator: LivePeer, block: int) -> None:
        fetched = await self.fetch(coordinator, block)
        await self.ctx.fault_point("train", fetched.version)  # a test's crash before the version: nothing sent
        loss = await asyncio.to_thread(self.train, block)
        reply = await self.messenger.request(update_url(coordinator, fetched), recipient=coordinator.record.peer_id,
                                             round=fetched.version, tensors=self.difference(fetched),
                                             metadata=update_metadata(loss, self.settings.local_steps))
        self.ctx.traffic.add_sent("block_update", reply.size_bytes)
        self._wait_past = (block, fetched.version)
        answer = reply.answer
        accepted = bool(answer.get("accepted"))
        self.updates["sent"] += 1
        self.updates["accepted" if accepted else "refused"] += 1
        self.last_reason = None if accepted else str(answer.get("reason"))
        self.emit("update", block=block, version=fetched.version, loss=loss,
             accepted=accepted, reason=answer.get("reason"))
        self._boundary = self._cycle_state()
        every = self.ctx.config.checkpoint_every
        if every and self.updates["sent"] % every == 0:
            await self.checkpoint()

    async def fetch(self, coordinator: LivePeer, block: int) -> BlockVersion:
        """Download the block's current version and load it (taking the block on, if it is new here)."""
        fetched = await fetch_block(self.ctx.http_client, coordinator, block)
        self._switch(block)
        self.stack.load_block_state(block, fetched.tensors)
        self.stack.load_embedding_state(fetched.embedding)
        self.version = fetched.version
        self.ctx.announce()
        return fetched

    def _switch(self, block: int | None) -> None:
        """Hold ``block`` (and a fresh optimizer for it) instead of the current one."""
        if block == self.block:
            return
        if self.block is not None:
            release_block(self.stack, self.block)
        self.block, self.optimizer = block, None
        if block is not None:
            hold_block(self.stack, block, device=self.ctx.device)
            self.optimizer = torch.optim.AdamW(block_parameters(self.stack, block), lr=self.settings.lr,
                                               weight_decay=0.0)
            if self._saved_optimizer is not None and self._saved_optimizer[0] == block:
                self.optimizer.load_state_dict(self._saved_optimizer[1])  # resumed: the same block again
            self._saved_optimizer = None
            self.emit("assigned", block=block)

    def train(self, block: int) -> float:
        """K local steps on the held block (blocking: run it in a worker thread); the mean loss."""
        assert self.optimizer is not None
        losses = []
        for _ in range(self.settings.local_steps):
            context, targets = self.sampler.sample(self.ctx.device)
            losses.append(train_step(self.stack, block, context, targets, self.optimizer,
                                     generator=self.noise))
        return sum(losses) / len(losses)

    def difference(self, fetched: BlockVersion) -> dict[str, torch.Tensor]:
        """The update: trained - fetched for the block (and for E when it is averaged), packed."""
        trained = {name: t.to("cpu") for name, t in self.stack.block_state(fetched.block).items()}
        update = {name: trained[name] - fetched.tensors[name] for name in trained}
        embedding = {}
        if self.settings.model.embedding == "averaged":
            now = {name: t.to("cpu") for name, t in self.stack.embedding_state().items()}
            embedding = {name: now[name] - fetched.embedding[name] for name in now}
        return pack(update, embedding)


    # -- resuming --------------------------------------------------------------------------------

    def _state_name(self) -> str:
        return f"{self.ctx.manifest.config.name}-{self.peer_id[:12]}-worker-state"

    def _cycle_state(self) -> dict[str, Any]:
        """The block, its optimizer state, the generators and counters after the last cycle (a
        cycle cut short by a shutdown is lost, as in a crash: the coordinator never saw it)."""
        block, optimizer = self._saved_optimizer or (self.block, None)  # not yet given its block back
        if self.optimizer is not None:
            block, optimizer = self.block, self.optimizer.state_dict()
        return snapshot({"block": block, "optimizer": optimizer,
                         "sampler": self.sampler.generator.get_state(), "noise": self.noise.get_state(),
                         "updates": dict(self.updates)})

    async def checkpoint(self) -> str | None:
        return await write_state(self.checkpoints, self._state_name(), self._boundary)

    def _resume(self) -> str:
        def apply(state: dict[str, Any]) -> None:
            self.sampler.generator.set_state(state["sampler"])
            self.noise.set_state(state["noise"])
            self.updates.update({key: int(value) for key, value in state["updates"].items()})
            if state["block"] is not None and state["optimizer"] is not None:
                self._saved_optimizer = (int(state["block"]), state["optimizer"])

        path = resume_state(self.checkpoints, self._state_name(), apply)
        if path:
            log.info("resumed from %s (updates %s)", path, self.updates)
        return path


def update_url(coordinator: LivePeer, fetched: BlockVersion) -> str:
    """Where an update trained from ``fetched`` goes (a signed message whose round is its version)."""
    return f"http://{coordinator.record.http_addr}/blocktrain/update/{fetched.block}/{fetched.version}"


def update_metadata(loss: float, steps: int) -> dict[str, str]:
    """What an update says about its training: the mean loss and the number of local steps."""
    return {"loss": repr(loss), "steps": str(steps)}

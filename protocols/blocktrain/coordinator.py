"""Role ``block-coordinator`` (the orchestrator of a blocktrain run): the run's block checkpoints, the
versions workers train against over HTTP, who trains which block, and the version loop that closes
each version at its deadline or once its workers were heard from. Every version it serves is on
disk first. Its endpoints and a version step by step: ``protocols/blocktrain/README.md``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from gossamer.peer.kit.conditions import wait_until
from gossamer.peer.kit.messaging import SignedMessenger, body_cap
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth
from gossamer.protocols.blocktrain import names
from gossamer.protocols.blocktrain.checkpoints import BlockCheckpoints, Version
from gossamer.protocols.blocktrain.core import build_stack, generate, heldout_ce
from gossamer.protocols.blocktrain.core.assignment import assign_blocks, coverage
from gossamer.protocols.blocktrain.settings import BlockTrainSettings
from gossamer.protocols.blocktrain.stack import pack, unpack
from gossamer.protocols.blocktrain.versions import BlockVersions
from gossamer.protocols.core.text_data import load_text, split_text
from gossamer.transport.http_server import path_int, stream_tensors

log = logging.getLogger(__name__)
_DECIMAL = re.compile(r"[0-9]{1,18}")
MAX_WAIT_S = 1.0
MAX_POLL_S = 30.0


class BlockCoordinatorRole(ProtocolRole[BlockTrainSettings]):
    """The run's block versions: served over HTTP, closed from the workers' updates, written to disk first."""

    name = names.COORDINATOR

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        config = self.settings.model
        self.stack = build_stack(config, seed=self.settings.text.seed, device=ctx.device)
        run_name = ctx.manifest.config.name
        self.directory = Path(ctx.config.checkpoint_dir).expanduser() / f"{run_name}-blocktrain"
        self.checkpoints = BlockCheckpoints(self.directory, ctx.manifest.run_id)
        blocks = [_cpu(self.stack.block_state(k)) for k in range(config.num_blocks)]
        self.board = BlockVersions(blocks, _cpu(self.stack.embedding_state()),
                                   deadline_s=self.settings.deadline_s, max_norm=self.settings.text.max_norm,
                                   now=time.monotonic(), adaptive=self.settings.pacing == "adaptive",
                                   embedding_averaged=config.embedding == "averaged")
        self.resumed = self._resume()
        # what GET serves: versions that are on disk
        self.published = [Version(v, dict(b))
                          for v, b in zip(self.board.versions, self.board.blocks, strict=True)]
        self.published_embedding = Version(self.board.embedding_version, dict(self.board.embedding))
        self.heldout = bytes(split_text(load_text(ctx.config.data or self.settings.text.data_source),
                                        heldout_fraction=self.settings.text.heldout_fraction).heldout.tolist())
        self.messenger = SignedMessenger(identity=ctx.identity, run_id=ctx.manifest.run_id,
                                         client=ctx.http_client, view=ctx.view, now=ctx.now,
                                         limits=ctx.http_config.limits,
                                         max_body_bytes=ctx.http_config.max_body_bytes)
        self.assignment: dict[str, int] = {}
        # min_workers were live once: from then on every live worker is assigned (a coordinator that
        # resumed versions past 0 from its checkpoints started before: the gate is not applied again)
        self.started = self.resumed and any(self.board.versions)
        self.finished = False
        self.heldout_ce: float | None = None
        self.series: dict[str, list[list[float]]] = {"heldout_ce": []}  # by total versions, for the swarm page
        self.initial_heldout_ce: float | None = None
        self._changed = asyncio.Event()
        self._moved = asyncio.Condition()  # notified after every step
        self.polls_waiting = 0  # long polls of workers waiting for a version to close
        self.poll_waiting = asyncio.Event()  # set while polls_waiting > 0

    # -- role interface -------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/blocktrain/state", self._serve_state),
                web.get("/blocktrain/block/{k}", self._serve_block),
                web.put("/blocktrain/{kind:update}/{k}/{round}", self._receive_update)]  # named for LocalNet faults

    async def start(self) -> None:
        await self.write_checkpoints()
        self.spawn(self._run(), name="versions")

    async def write_checkpoints(self) -> None:
        """Write every block's current version and E (at start: the initial or resumed versions)."""
        for k in range(self.board.num_blocks):
            await asyncio.to_thread(self.checkpoints.write_block, k, self.published[k])
        await asyncio.to_thread(self.checkpoints.write_embedding, self.published_embedding)

    def _published_versions(self) -> list[int]:
        return [block.version for block in self.published]

    @property
    def round(self) -> int:
        return min(self.board.versions)

    def gauges(self) -> dict[str, float]:
        gauges = {f"blocktrain_block{k}_version": float(v) for k, v in enumerate(self.board.versions)}
        gauges["blocktrain_polls_waiting"] = float(self.polls_waiting)
        if self.heldout_ce is not None:
            gauges["blocktrain_heldout_ce"] = self.heldout_ce
        return gauges

    def status(self) -> dict[str, Any]:
        return {"versions": list(self.board.versions), "assignment_by_worker": dict(self.assignment),
                "started": self.started, "finished": self.finished, "heldout_ce": self.heldout_ce,
                "checkpoints": str(self.directory),
                "ledgers": self.board.ledgers.last(6), "series": self.series, "pacing": self.board.pacing_status()}

    def health(self) -> RoleHealth:
        health = super().health()
        if health.state != FAILED and self.finished:
            return RoleHealth(FINISHED, f"every block at version {self.settings.versions}; checkpoints {self.directory}")
        return health

    # -- HTTP -----------------------------------------------------------------------------------

    async def _serve_state(self, request: web.Request) -> web.Response:
        query = request.rel_url.query
        if "block" in query:
            k = _block_index(query["block"], self.board.num_blocks)
            after = _number(query, "after", int)
            wait_s = min(MAX_POLL_S, _number(query, "wait_s", float, 10.0))
            before = dict(self.assignment)
            worker = query.get("worker")

            def moved() -> bool:
                return (self.finished or self.published[k].version > after or self.assignment != before
                        or (worker is not None and self._lost(worker, k, after)))

            self.polls_waiting += 1
            self.poll_waiting.set()
            try:
                await wait_until(self._moved, moved, timeout_s=wait_s)
            finally:
                self.polls_waiting -= 1
                if not self.polls_waiting:
                    self.poll_waiting.clear()
        now = time.monotonic()
        arrived = [self.board.ledgers.get((k, v.version)) for k, v in enumerate(self.published)]
        return web.json_response({"versions": self._published_versions(), "assignment": dict(self.assignment),
                                  "arrived": [ledger.arrived if ledger else [] for ledger in arrived],
                                  "finished": self.finished, "num_blocks": self.board.num_blocks,
                                  "deadlines_in_s": [round(d - now, 3) for d in self.board.deadlines]})

    def _lost(self, worker: str, k: int, version: int) -> bool:
        """Whether block k's open version is still ``version`` and holds no update of ``worker`` (e.g.
        this coordinator was restarted and lost it): that worker should train again, not wait. (A
        version that closed and is being written is not open: its next one is served soon.)"""
        ledger = self.board.ledgers.get((k, version))
        return self.board.versions[k] == version and (ledger is None or worker not in ledger.arrived)

    async def _serve_block(self, request: web.Request) -> web.StreamResponse:
        k = path_int(request, "k", below=self.board.num_blocks)
        block, embedding = self.published[k], self.published_embedding
        metadata = {"run_id": self.ctx.manifest.run_id, "block": str(k), "version": str(block.version),
                    "embedding_version": str(embedding.version)}
        return await stream_tensors(request, pack(block.tensors, embedding.tensors), metadata)

    async def _receive_update(self, request: web.Request) -> web.Response:
        k = path_int(request, "k", below=self.board.num_blocks)
        base = path_int(request, "round")
        expected = pack(self.board.blocks[k], self.board.embedding)
        received = await self.messenger.receive(request, sender_role=names.WORKER, round=base,
                                                max_body_bytes=body_cap(expected))
        sender = received.envelope.sender
        self.ctx.traffic.add_received("block_update", received.size_bytes)
        try:
            block, embedding = unpack(received.tensors)
            loss = float(received.metadata.get("loss", "nan"))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"bad update: {exc}") from exc
        target = self.settings.versions
        if target and self.board.versions[k] >= target:
            reason = f"block {k} is finished (version {self.board.versions[k]} of {target})"
            if (ledger := self.board.ledgers.get((k, base))) is not None:
                ledger.reject(sender, reason)  # in the ledger of the version it was trained from
        else:
            reason = self.board.offer(k, base, sender, {"block": block, "embedding": embedding}, loss=loss,
                                      now=time.monotonic())
        self._changed.set()
        if reason is not None:
            log.info("update from %s for block %d version %d refused: %s", sender[:12], k, base, reason)
        return web.json_response({"accepted": reason is None, "reason": reason,
                                  "version": self.board.versions[k]})

    # -- the version loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        await self._evaluate()
        self.initial_heldout_ce = self.heldout_ce
        while not self.finished:
            await self.step()
            timeout = min(MAX_WAIT_S, max(0.05, self.board.next_deadline() - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
            self._changed.clear()

    async def step(self) -> None:
        """One pass of the version loop: reassign, close the versions that are due, extend the
        deadlines that passed with nothing accepted, and finish when every block is at the target."""
        self._reassign()
        for k in range(self.board.num_blocks):
            now = time.monotonic()
            assigned = [w for w, b in self.assignment.items() if b == k]
            if self.board.due(k, assigned, now=now):
                await self._close(k)
            elif self.board.overdue_and_empty(k, now=now):
                self.board.extend(k, now=now)
        target = self.settings.versions
        if target and min(self.board.versions) >= target and not self.finished:
            self.finished = True
            self.assignment = {}
            self.ctx.announce()
            sample = await asyncio.to_thread(self._sample) if self.settings.sample_bytes else None
            self.emit("finished", versions=list(self.board.versions),
                      heldout_ce=self.heldout_ce, initial_heldout_ce=self.initial_heldout_ce,
                      checkpoints=str(self.directory), sample=sample, prompt=self.settings.sample_prompt)
            log.info("all %d blocks reached version %d; checkpoints in %s", self.board.num_blocks, target,
                     self.directory)
        async with self._moved:
            self._moved.notify_all()

    def _reassign(self) -> None:
        live = self.ctx.view.live(now=self.ctx.now())
        workers = [p.record.peer_id for p in live if names.WORKER in p.record.roles]
        if not self.started:
            if len(workers) < self.settings.min_workers:
                return
            self.started = True
            log.info("%d block worker(s) live (min_workers %d): training starts", len(workers),
                     self.settings.min_workers)
        target = self.settings.versions
        finished = [k for k, v in enumerate(self.board.versions) if target and v >= target]
        assignment = assign_blocks(self.board.num_blocks, workers, previous=self.assignment,
                                   versions=self.board.versions, finished=finished)
        for k in range(self.board.num_blocks):
            self.board.expect(k, [w for w, b in assignment.items() if b == k])
        if assignment != self.assignment:
            self.assignment = assignment
            self.emit("assignment", assignment=assignment,
                 coverage=coverage(assignment, self.board.num_blocks), versions=list(self.board.versions))

    async def _close(self, k: int) -> None:
        """Close block k's version: average, write the new version to disk, and only then serve it."""
        ledger = self.board.close(k, now=time.monotonic())
        await self.ctx.fault_point("aggregate", ledger.version)  # a test's crash: averaged, nothing written
        block = Version(self.board.versions[k], dict(self.board.blocks[k]))
        await asyncio.to_thread(self.checkpoints.write_block, k, block)
        if self.board.embedding_version != self.published_embedding.version:
            embedding = Version(self.board.embedding_version, dict(self.board.embedding))
            await asyncio.to_thread(self.checkpoints.write_embedding, embedding)
            self.published_embedding = embedding
        await self.ctx.fault_point("publish", ledger.version)  # a test's crash: on disk, not yet served
        self.published[k] = block
        self.ctx.announce()
        await self.ctx.fault_point("open", block.version)  # a test's crash: served, no update of it taken yet
        self._reassign()
        await self._evaluate()
        if self.heldout_ce is not None:
            self.series["heldout_ce"].append([sum(self.board.versions), self.heldout_ce])
            del self.series["heldout_ce"][:-2000]
        self.emit("version", block=k, version=self.board.versions[k], used=ledger.used,
             rejected=ledger.rejected, timed_out=ledger.timed_out, train_loss=ledger.train_loss,
             update_norm=ledger.update_norm, heldout_ce=self.heldout_ce, versions=list(self.board.versions),
             target=self.settings.versions, deadline_s=ledger.deadline_s, slow=ledger.slow)
        log.info("block %d: version %d from %d update(s) (timed out %d, rejected %d); held-out CE %s", k,
                 self.board.versions[k], len(ledger.used), len(ledger.timed_out), len(ledger.rejected),
                 f"{self.heldout_ce:.3f}" if self.heldout_ce is not None else "-")

    async def _evaluate(self) -> None:
        if self.settings.text.eval_batches:
            self.heldout_ce = await asyncio.to_thread(self._heldout_ce)

    def _load_board(self) -> torch.device:
        """Load the board's current blocks and E into ``self.stack`` (blocking); its device."""
        device = self.ctx.device
        for k, state in enumerate(self.board.blocks):
            self.stack.load_block_state(k, {name: t.to(device) for name, t in state.items()})
        self.stack.load_embedding_state({name: t.to(device) for name, t in self.board.embedding.items()})
        return device

    def _heldout_ce(self) -> float:
        device = self._load_board()
        return heldout_ce(self.stack, self.heldout, batches=self.settings.text.eval_batches, batch_size=8,
                          generator=torch.Generator(device=device).manual_seed(0))

    def _sample(self) -> str:
        """The final stack's continuation of ``sample_prompt``, sampled autoregressively (one pass
        per byte: fewer passes give mostly placeholder spaces, docs/EXPERIMENTS.md section 4)."""
        device = self._load_board()
        settings = self.settings
        text = generate(self.stack, settings.sample_prompt.encode("utf-8"), new_bytes=settings.sample_bytes,
                        passes=max(1, settings.model.context // 2), temperature=settings.sample_temperature,
                        generator=torch.Generator(device=device).manual_seed(settings.text.seed))
        return text.decode("utf-8", "replace")

    # -- checkpoints ----------------------------------------------------------------------------

    def _resume(self) -> bool:
        """Adopt this run's checkpoints from an earlier life of the coordinator, if every block has one."""
        found = self.checkpoints.read(self.board.num_blocks)
        if found is None:
            return False
        blocks, embedding = found
        board = self.board
        if not all(_same_layout(b.tensors, board.blocks[k]) for k, b in enumerate(blocks)) or (
                embedding is not None and not _same_layout(embedding.tensors, board.embedding)):
            log.warning("not resuming from %s: the checkpoints do not match the run's model", self.directory)
            return False
        self.board = BlockVersions([b.tensors for b in blocks],
                                   board.embedding if embedding is None else embedding.tensors,
                                   deadline_s=board.deadline_s, max_norm=board.max_norm,
                                   embedding_averaged=board.embedding_averaged, now=time.monotonic(),
                                   adaptive=board.adaptive,
                                   versions=[b.version for b in blocks],
                                   embedding_version=0 if embedding is None else embedding.version)
        log.info("resumed from %s at versions %s", self.directory, self.board.versions)
        return True


def _block_index(text: str, num_blocks: int) -> int:
    if not _DECIMAL.fullmatch(text) or not 0 <= int(text) < num_blocks:
        raise web.HTTPNotFound(text=f"no block {text[:20]!r} (the run has {num_blocks})")
    return int(text)


def _number(query: Any, name: str, kind: type, default: float | None = None) -> Any:
    text = query.get(name)
    if text is None and default is not None:
        return default
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise web.HTTPBadRequest(
            text=f"query parameter {name}={str(text)[:20]!r} is not a {kind.__name__}") from None


def _same_layout(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(got[n].shape == want[n].shape and got[n].dtype == want[n].dtype
                                             for n in want)


def _cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to("cpu").clone() for name, tensor in state.items()}

"""Role ``tlpp-server``: the server side of a TL++ run, taken by the orchestrator (the run owner).

It holds the master model and its optimizer and drives the virtual batches
(``protocols.tlpp.steps``): it waits until ``min_nodes`` data nodes (and, in secure mode, a
helper) are live, builds the schedule from the sample counts the nodes publish in their signed
records (``VirtualBatchScheduler``, shuffled per epoch with the run seed), with ``data.normalize =
"nodes"`` pools the per-channel counts and sums those nodes publish into the model's input
normalisation (once, before the first step; a ``tlpp.normalized`` event; a node whose record
holds no valid statistics is not scheduled; a resumed server keeps its saved model's), and runs one virtual
batch after another until ``steps`` (or ``epochs`` passes) are done. ``min_nodes`` gates the
start only: a run whose nodes leave goes on with those that are left (a resumed server waits for
as few as a step needs, not for ``min_nodes`` again). After each step it applies
the summed gradients with its optimizer, writes the step's ledger, emits a ``tlpp.step`` event
(its ledger: loss, accuracy, nodes used and dropped, bytes) and every ``eval_every`` steps a ``tlpp.eval`` on the
held-out split it keeps (labels and loss are visible to the orchestrator by design; the test
images never leave it). Each node's request times are measured (``pacing``): ``/status``
(``pacing``: each phase's next deadline, the nodes flagged fail-slow, each node's time over the
others') and each step's ledger (``deadline_s``, ``slow``) say what the waits were and who is
slow; with ``hyper.pacing = "adaptive"`` a node late past a phase's adaptive deadline is dropped
from the step as one that timed out. At the end: a final evaluation, a checkpoint (safetensors, written
atomically) and ``tlpp.finished``.

Membership: a node that failed in a step is taken out of the schedule at once (the rest of the
epoch follows the reduced schedule from the same position, so in that epoch a few samples may be
seen twice or not at all); a live node the schedule lacks is scheduled again from the next step
once its record was renewed after it failed (a node that was slow once is back within a
heartbeat; one that keeps failing waits longer each time: ``scheduling``), and at each epoch
boundary the schedule is rebuilt from the live nodes, so nodes that left the view are no longer
scheduled. A
node that left the view mid-epoch stays scheduled until it fails a request (records can lag a
loaded host by a heartbeat; a node that still answers is still a node). With no node left, it
waits. A secure node that refuses a forward as a step it answered already (this orchestrator,
resumed from a checkpoint, replays the steps after it) stays scheduled: those steps go on without it.

Secure mode (SECURITY.md, "TL++ secure mode: threat model"): the helper is the one the manifest
pins (``hyper.helper``), never another live peer with the role; the run must not admit anyone
(``admission.policy = "open"`` is refused); the schedule drops an epoch's tail batch shorter than
``min_batch``, and a schedule shrunk by failures to fewer than ``min_sum_nodes`` nodes (or
``min_batch`` samples) is rebuilt from the live nodes instead of running steps that could
reveal nothing.

A helper failure (``HelperFailed``), or a setting the truncation guard refuses, stops training
with one clear error: logged, in ``/status``, a ``tlpp.error`` event, and a checkpoint of the
model so far; the step it stopped in applies nothing and its ledger stays in the history, every
node of it rejected with why; the role is failed (``/healthz`` answers 503) and ``gossamer orchestrator`` exits
non-zero. When training is finished the record says so (``assignment.tlpp_finished``), so the
nodes and the helper know the run is over.

Fault points (``RoleContext.fault_point``, where a test may crash or stall it; ``fault_runs``):
``step`` of s (nothing of step s sent), ``backward`` of s (``steps``: the forwards answered, no
backward request sent) and ``aggregate`` of s (the step's gradient summed, not applied).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.ledger import History
from gossamer.peer.kit.secure_link import SecureLinks
from gossamer.peer.kit.state_tree import resume_state, snapshot, write_state
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth
from gossamer.protocols.tlpp import names
from gossamer.protocols.tlpp.core import (
    ChannelStats,
    TraversalError,
    VirtualBatch,
    affine_server,
)
from gossamer.protocols.tlpp.data import DataSourceError, load_run_data
from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.scheduling import Scheduling
from gossamer.protocols.tlpp.settings import TlppSettings, check_secure_admission
from gossamer.protocols.tlpp.steps import StepDriver, TrainingStopped, grads_finite
from gossamer.protocols.tlpp.wire import ShareLog

log = logging.getLogger(__name__)


class TlppServerRole(Scheduling, ProtocolRole[TlppSettings]):
    """The TL++ orchestrator's server side (see the module docstring)."""

    name = names.SERVER
    # per-step loss, accuracy and batch makeup: only the peer's owner reads them (/status, /metrics)
    private_status = frozenset({"ledgers", "series", "evaluation", "tlpp_train_loss", "tlpp_test_loss",
                                "tlpp_test_accuracy"})

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.require_run_owner()
        settings = self.settings
        self.model = settings.build_model(ctx.device)
        node_side, server_side = settings.split(self.model)
        if settings.secure:
            check_secure_admission(settings, ctx.manifest.config.policy)
            try:
                affine_server(server_side)
            except TraversalError as exc:
                raise ConfigError(f"secure mode: {exc}") from exc
        try:
            self.test = load_run_data(settings.test, settings)
        except DataSourceError as exc:
            raise DataSourceError(f"data.test: {exc}") from exc
        self.optimizer = _optimizer(self.model, settings)
        self.links = SecureLinks(identity=ctx.identity, run_id=ctx.manifest.run_id, view=ctx.view, traffic=ctx.traffic)
        self.driver = StepDriver(settings=settings, model=self.model, node_side=node_side, server_side=server_side,
                                 links=self.links, share_log=ShareLog(ctx.config.share_log or None), device=ctx.device,
                                 fault_point=ctx.fault_point)
        self.history: History[int, StepLedger] = History()
        self.checkpoints = Checkpoints(ctx.config.checkpoint_dir, run_id=ctx.manifest.run_id, format="gossamer/tlpp")
        self.step = 0
        self.total_steps = 0  # known once the first schedule is built
        self.position = (0, 0)  # (epoch, index of the next virtual batch in it)
        self.series: dict[str, list[list[float]]] = {"train_loss": [], "test_loss": []}  # for the swarm page
        self.last_eval: dict[str, float] | None = None
        self.finished = False
        self.error = ""
        self.checkpoint_path = ""
        self.done = asyncio.Event()  # set when training finished or stopped
        self._scheduled: dict[str, tuple[int, ChannelStats | None]] = {}  # the nodes of the latest schedule
        self._left_out: dict[str, float] = {}  # node -> scheduled again once its record is newer than this
        self._strikes: Counter[str] = Counter()  # failures since a step last used the node
        self.resumed_from = self._resume()

    # -- role interface -------------------------------------------------------------------------

    async def start(self) -> None:
        self.spawn(self._run(), name="training")

    async def aclose(self) -> None:
        await super().aclose()
        await self.links.aclose()

    @property
    def round(self) -> int:
        return self.step

    def health(self) -> RoleHealth:
        if self.error:
            return RoleHealth(FAILED, self.error)
        health = super().health()
        if health.state != FAILED and self.finished:
            return RoleHealth(FINISHED, f"{self.step} steps; checkpoint {self.checkpoint_path}")
        return health

    def status(self) -> dict[str, Any]:
        return {"assignment": {"tlpp_finished": True} if self.finished else {}, "mode": self.settings.mode, "step": self.step, "weights_version": self.driver.version,
                "finished": self.finished, "error": self.error, "checkpoint": self.checkpoint_path,
                "evaluation": self.last_eval, "ledgers": self.history.last(3), "series": self.series,
                "pacing": self.driver.pacing.status()}

    def gauges(self) -> dict[str, float]:
        gauges = {"tlpp_step": float(self.step)}
        if self.history:
            gauges["tlpp_train_loss"] = self.history.values()[-1].loss
        if self.last_eval:
            gauges["tlpp_test_loss"], gauges["tlpp_test_accuracy"] = self.last_eval["loss"], self.last_eval["accuracy"]
        return gauges

    # -- the run --------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._train()
        except TrainingStopped as exc:
            await self._stop(exc)
        except Exception as exc:  # a bug, not a peer's fault: report it like any stop, with the traceback
            log.exception("TL++ training failed")
            await self._stop(TrainingStopped(f"internal error: {type(exc).__name__}: {exc}"))
        else:
            await self._finish()
        finally:
            self.done.set()

    async def _train(self) -> None:
        # min_nodes gates the start only: a resumed run goes on with the nodes that are left
        wanted = self._fewest if self.resumed_from else self.settings.min_nodes
        scheduler = await self._schedule(max(wanted, self._fewest))
        if self.settings.secure:
            scheduler = await self._until_helper_sees(scheduler, wanted)
        if self.settings.normalize == "nodes" and not self.resumed_from:  # a resumed model keeps its own
            self._normalize()
        total = self.settings.steps or self.settings.epochs * scheduler.steps_per_epoch
        self.total_steps = total
        epoch, start = self.position  # (0, 0), or where an earlier life of this server stopped
        while self.step < total:
            batches, index, start = scheduler.epoch(epoch), start, 0
            while index < len(batches) and self.step < total:
                helper = await self._helper() if self.settings.secure else None
                ledger = await self._one_step(batches[index], helper)
                reduced = self._reduced(scheduler, ledger)
                if reduced is None:
                    await self._until_nodes_change(set(scheduler.counts))
                    reduced = await self._schedule(self._fewest)
                reduced = self._regrown(reduced)
                if reduced is not scheduler:
                    scheduler, batches = reduced, reduced.epoch(epoch)
                index += 1
            epoch += 1
            scheduler = await self._schedule(self._fewest)

    async def _one_step(self, batch: VirtualBatch, helper: str | None) -> StepLedger:
        ledger = StepLedger(step=self.step, epoch=batch.epoch, index=batch.index, mode=self.settings.mode)
        sent, received = _tlpp_bytes(self.ctx.traffic.sent), _tlpp_bytes(self.ctx.traffic.received)
        started = time.monotonic()
        await self.ctx.fault_point("step", self.step)  # a test's crash or stall before the step: nothing sent
        # a node neither live nor in the latest schedule left: it is no longer measured against the others
        # (a slow node whose record lags its heartbeat is still scheduled: it stays measured, and flagged)
        self.driver.pacing.keep_only({*self._scheduled, *self._node_counts()})
        try:
            grads = await self.driver.run(batch, ledger, helper)
        except TrainingStopped as exc:  # the step is accounted for (every node rejected with why), not applied
            ledger.give_up(f"training stopped: {exc}")
            ledger.wall_s = round(time.monotonic() - started, 4)
            self.history.add(ledger.step, ledger)
            raise
        await self.ctx.fault_point("aggregate", self.step)  # a test's crash: the step's gradient summed, not applied
        if grads is not None and not grads_finite(grads):
            ledger.note, grads = "gradients are not finite; step skipped", None
        if grads is not None:
            self._apply(grads)
            ledger.applied = True
        ledger.bytes_sent = _tlpp_bytes(self.ctx.traffic.sent) - sent
        ledger.bytes_received = _tlpp_bytes(self.ctx.traffic.received) - received
        ledger.wall_s = round(time.monotonic() - started, 4)
        self.history.add(ledger.step, ledger)
        self.step += 1
        self.position = (batch.epoch, batch.index + 1)
        _add_point(self.series["train_loss"], self.step, ledger.loss)
        self.emit("step", **ledger.to_json())
        every = self.ctx.config.checkpoint_every
        if every and self.step % every == 0:
            await self.checkpoint()
        if ledger.rejected:
            log.warning("step %d: dropped %s", ledger.step, {n[:12]: r for n, r in ledger.rejected.items()})
        if self.settings.eval_every and self.step % self.settings.eval_every == 0:
            await self._evaluate()
        return ledger

    def _apply(self, grads: dict[str, torch.Tensor]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for name, param in self.model.named_parameters():
            param.grad = grads[name].to(device=param.device, dtype=param.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.driver.version += 1

    async def _evaluate(self) -> dict[str, float]:
        self.last_eval = await asyncio.to_thread(self._test_metrics)
        _add_point(self.series["test_loss"], self.step, self.last_eval["loss"])
        self.emit("eval", step=self.step, steps=self.total_steps, **self.last_eval)
        return self.last_eval

    def _test_metrics(self) -> dict[str, float]:
        with torch.no_grad():
            logits = self.model(self.test.x.to(self.ctx.device))
            labels = self.test.y.to(self.ctx.device)
            loss = float(F.cross_entropy(logits, labels))
            accuracy = float((logits.argmax(dim=1) == labels).float().mean())
        return {"loss": loss, "accuracy": accuracy, "samples": len(self.test)}

    # -- the end --------------------------------------------------------------------------------

    async def _finish(self) -> None:
        evaluated_now = self.settings.eval_every and self.step % self.settings.eval_every == 0
        metrics = self.last_eval if evaluated_now and self.last_eval else await self._evaluate()
        self.checkpoint_path = await self._checkpoint()
        self.finished = True
        self.emit("finished", step=self.step, applied_steps=self.driver.version,
             test_loss=metrics["loss"], test_accuracy=metrics["accuracy"], checkpoint=self.checkpoint_path)
        log.info("TL++ training finished after %d steps: test loss %.4f, accuracy %.3f; checkpoint %s", self.step,
                 metrics["loss"], metrics["accuracy"], self.checkpoint_path)

    async def _stop(self, exc: TrainingStopped) -> None:
        self.error = str(exc)
        log.error("TL++ training stopped at step %d: %s", self.step, exc)
        self.checkpoint_path = await self._checkpoint()
        self.emit("error", step=self.step, message=self.error, kind=type(exc).__name__,
             checkpoint=self.checkpoint_path)

    async def _checkpoint(self) -> str:
        params = {name: t.detach().cpu().clone() for name, t in self.model.state_dict().items()}
        path = await self.checkpoints.write_async(f"{self.ctx.manifest.config.name}-tlpp", params, step=str(self.step),
                                                  cut=str(self.settings.cut), mode=self.settings.mode)
        return str(path)


    # -- resuming --------------------------------------------------------------------------------

    def _state_name(self) -> str:
        return f"{self.ctx.manifest.config.name}-tlpp-state"

    async def checkpoint(self) -> str | None:
        """The model, the optimizer, the step and the schedule position (consistent at every await:
        a step's gradient is applied and counted without one in between)."""
        state = snapshot({"step": self.step, "version": self.driver.version, "position": list(self.position),
                          "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})
        return await write_state(self.checkpoints, self._state_name(), state, step=str(self.step))

    def _resume(self) -> str:
        def apply(state: dict[str, Any]) -> None:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.driver.version = int(state["step"]), int(state["version"])
            self.position = (int(state["position"][0]), int(state["position"][1]))

        path = resume_state(self.checkpoints, self._state_name(), apply)
        if path:
            log.info("resumed from %s at step %d", path, self.step)
        return path


def _add_point(points: list[list[float]], x: int, y: float, *, keep: int = 2000) -> None:
    if y == y:  # not NaN (a step whose loss was not computed)
        points.append([x, y])
        del points[:-keep]


def _optimizer(model: torch.nn.Module, settings: TlppSettings) -> torch.optim.Optimizer:
    if settings.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                               weight_decay=settings.weight_decay)
    return torch.optim.Adam(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)


def _tlpp_bytes(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.startswith("tlpp_"))

"""Role ``tlpp-orchestrator``: the run owner's TL++ trainer. It holds the master model (the layers
above the cut are its own), the optimizer and the virtual-batch schedule over the live data nodes,
drives one step after another (``steps.StepDriver``), evaluates on its held-out split and writes
checkpoints. Who it schedules, resuming and stopping: ``protocols/tlpp/README.md``."""

from __future__ import annotations

import asyncio
import logging
import math
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
    VirtualBatchScheduler,
    affine_layer,
    pool_stats,
    read_stats,
)
from gossamer.protocols.tlpp.data import DataSourceError, load_run_data
from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.settings import TlppSettings, check_secure_admission
from gossamer.protocols.tlpp.steps import StepDriver, TrainingStopped, grads_finite
from gossamer.protocols.tlpp.wire import ShareLog

log = logging.getLogger(__name__)
WAIT_POLL_S = 10.0
"""How long one wait for the view (nodes, the helper) lasts before it is logged again."""
MAX_LEFT_OUT_S = 60.0
"""The most a node that keeps failing waits, past its record's time when it was taken out, to come back."""


class TlppOrchestratorRole(ProtocolRole[TlppSettings]):
    """The TL++ orchestrator: the run owner's trainer (``protocols/tlpp/README.md``, "Roles")."""

    name = names.ORCHESTRATOR
    # per-step loss, accuracy and batch makeup: only the peer's owner reads them (/status, /metrics)
    private_status = frozenset({"ledgers", "series", "evaluation", "tlpp_train_loss", "tlpp_test_loss",
                                "tlpp_test_accuracy"})

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.require_run_owner()
        settings = self.settings
        self.model = settings.build_model(ctx.device)
        node_side, orchestrator_side = settings.split(self.model)
        if settings.secure:
            check_secure_admission(settings, ctx.manifest.config.policy)
            try:
                affine_layer(orchestrator_side)
            except TraversalError as exc:
                raise ConfigError(f"secure mode: {exc}") from exc
        try:
            self.test = load_run_data(settings.test, settings)
        except DataSourceError as exc:
            raise DataSourceError(f"data.test: {exc}") from exc
        self.optimizer = settings.build_optimizer(self.model)
        self.links = SecureLinks(identity=ctx.identity, run_id=ctx.manifest.run_id, view=ctx.view, traffic=ctx.traffic)
        self.driver = StepDriver(settings=settings, model=self.model, node_side=node_side,
                                 orchestrator_side=orchestrator_side, links=self.links,
                                 share_log=ShareLog(ctx.config.share_log or None), device=ctx.device,
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
        return {"assignment": {"tlpp_finished": True} if self.finished else {}, "mode": self.settings.mode,
                "step": self.step, "weights_version": self.driver.version, "finished": self.finished, "error": self.error, "checkpoint": self.checkpoint_path,
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
        epoch, start = self.position  # (0, 0), or where an earlier life of this orchestrator stopped
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

    # -- who it trains with ---------------------------------------------------------------------

    @property
    def _fewest(self) -> int:
        """The fewest nodes a schedule needs: secure mode's k (``min_sum_nodes``), else one."""
        return self.settings.min_sum_nodes if self.settings.secure else 1

    def _live(self, role: str) -> list[str]:
        return [p.record.peer_id for p in self.peers_with(role)]

    def _node_counts(self) -> dict[str, int]:
        return {peer: samples for peer, (samples, _) in self._nodes().items()}

    def _nodes(self) -> dict[str, tuple[int, ChannelStats | None]]:
        """The live data nodes with a valid sample count in their records, and their per-channel
        statistics (with ``data.normalize = "nodes"``; a node without valid ones is left out). A
        node whose record says ``private`` (behind NAT, no relay) is left out until it says otherwise."""
        nodes = {}
        for peer in self.ctx.view.live(now=self.ctx.now()):
            assignment = peer.record.assignment
            samples = assignment.get("tlpp_samples")
            if names.NODE not in peer.record.roles or isinstance(samples, bool) or not isinstance(samples, int) \
                    or samples < 1 or not peer.record.reachable:  # private, no relay: nobody can ask it anything
                continue
            stats = None
            if self.settings.normalize == "nodes":
                try:
                    stats = read_stats(assignment.get("tlpp_stats"), channels=self.settings.input_shape[0],
                                       count=samples)
                except TraversalError:
                    continue
            nodes[peer.record.peer_id] = (samples, stats)
        return nodes

    def _normalize(self) -> None:
        """Pool the per-channel statistics of the nodes training starts with into the model's input
        normalisation (its buffers go to the nodes with the node-side weights)."""
        used = sorted(self._scheduled)
        stats = [s for _, s in (self._scheduled[n] for n in used) if s is not None]
        mean, std = pool_stats(stats, positions=math.prod(self.settings.input_shape[1:]))
        layer = self.settings.normalization(self.model)
        assert layer is not None  # data.normalize = "nodes" builds it
        layer.set(mean, std)
        self.emit("normalized", nodes=used, samples=sum(s.count for s in stats), mean=list(mean), std=list(std))
        log.info("input normalisation pooled from %d node(s): mean %s, std %s", len(used),
                 [round(m, 4) for m in mean[:8]], [round(v, 4) for v in std[:8]])

    async def _schedule(self, wanted: int) -> VirtualBatchScheduler:
        """A schedule over the live nodes, once ``wanted`` of them (and a helper, in secure mode) are
        live: ``min_nodes`` before the first step, then one (``min_nodes`` gates the start only; a
        run whose nodes leave goes on with those that are left)."""
        least = self.settings.smallest_batch if self.settings.secure else 1

        def ready() -> bool:
            counts = self._node_counts()
            return len(counts) >= wanted and sum(counts.values()) >= least and (
                not self.settings.secure or self._helper_live())

        while not ready():
            nodes, helpers = len(self._node_counts()), int(self._helper_live())
            log.info("waiting for TL++ nodes: %d of %d live%s", nodes, wanted,
                     f", {helpers} helper(s)" if self.settings.secure else "")
            self.emit("waiting", nodes=nodes, wanted=wanted, helpers=helpers, helper_sees=None)
            await self.ctx.until_view(ready, timeout_s=WAIT_POLL_S)
        self._scheduled = self._nodes()
        return VirtualBatchScheduler({n: samples for n, (samples, _) in self._scheduled.items()},
                                     batch_size=self.settings.batch_size, seed=self.settings.seed,
                                     drop_last=self.settings.drop_last, min_size=least)

    async def _until_helper_sees(self, scheduler: VirtualBatchScheduler, wanted: int) -> VirtualBatchScheduler:
        """Secure mode, before the first step: a schedule of which the helper sees at least
        ``wanted`` nodes live, so that step 0 does not race the helper's view of the nodes (a
        node it cannot see could not push it a share)."""
        while True:
            helper = await self._helper()
            seen = await self.driver.confirm(helper, scheduler.counts, step=self.step)
            if len(seen) >= wanted:
                return scheduler
            log.info("waiting for the helper to see the TL++ nodes: %d of %d", len(seen), wanted)
            self.emit("waiting", nodes=len(scheduler.counts), wanted=wanted, helpers=1, helper_sees=len(seen))
            scheduler = await self._schedule(wanted)

    async def _until_nodes_change(self, failed: set[str]) -> None:
        """Every scheduled node failed: give their records up to a TTL to expire (or others to
        come) instead of spending steps on nodes that are gone."""
        await self.ctx.until_view(lambda: set(self._node_counts()) != failed, timeout_s=self.ctx.manifest.ttl_s)

    def _helper_live(self) -> bool:
        return self.settings.helper in self._live(names.HELPER)

    async def _helper(self) -> str:
        """The helper the manifest pins, once it is live (never another peer with the role)."""
        while not self._helper_live():
            self.emit("waiting", nodes=len(self._node_counts()), wanted=1, helpers=0, helper_sees=None)
            await self.ctx.until_view(self._helper_live, timeout_s=WAIT_POLL_S)
        return self.settings.helper

    def _reduced(self, scheduler: VirtualBatchScheduler, ledger: StepLedger) -> VirtualBatchScheduler | None:
        """The schedule without the nodes that failed this step; None if none is left."""
        for node in ledger.used:
            self._strikes.pop(node, None)
        leaving = {n for n in scheduler.counts if n in ledger.rejected and n not in self.driver.kept}
        if not leaving:
            return scheduler
        heartbeat_s = self.ctx.manifest.config.heartbeat_s
        for node in leaving:  # measured on the node's own record clock: no skew between the hosts
            live = self.ctx.view.get(node)
            self._strikes[node] += 1
            self._left_out[node] = (live.record.timestamp if live is not None else self.ctx.now()) + min(
                MAX_LEFT_OUT_S, heartbeat_s * (2 ** (self._strikes[node] - 1) - 1))
        self.driver.forget(leaving)
        left = {n: c for n, c in scheduler.counts.items() if n not in leaving}
        if len(left) < self._fewest or (self.settings.secure and sum(left.values()) < self.settings.smallest_batch):
            return None
        log.info("taking %d node(s) out of the schedule: %s", len(leaving), sorted(n[:12] for n in leaving))
        return scheduler.without(leaving)

    def _regrown(self, scheduler: VirtualBatchScheduler) -> VirtualBatchScheduler:
        """The schedule with the live nodes it lacks whose records were renewed since they were
        taken out (a dead node never renews it; one that failed again waits 1, 3, 7, ... heartbeats
        more, at most ``MAX_LEFT_OUT_S``); ``scheduler`` itself when there are none."""
        counts = self._node_counts()
        back = [peer.record.peer_id for peer in self.ctx.view.live(now=self.ctx.now())
                if peer.record.peer_id in counts and peer.record.peer_id not in scheduler.counts
                and peer.record.timestamp > self._left_out.get(peer.record.peer_id, -math.inf)]
        if not back:
            return scheduler
        log.info("scheduling %d node(s) again: %s", len(back), sorted(n[:12] for n in back))
        for node in back:
            self._left_out.pop(node, None)
        self._scheduled.update({n: v for n, v in self._nodes().items() if n in back})
        return scheduler.joined({n: counts[n] for n in back})

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


def _tlpp_bytes(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k.startswith("tlpp_"))

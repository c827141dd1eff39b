"""Who a TL++ server trains with: the live data nodes and the sample counts (and per-channel
statistics) their signed records publish, the virtual-batch schedule over them, the input
normalisation pooled from them, and the helper the manifest pins.

``min_nodes`` gates the start only. A node that failed in a step is taken out of the schedule at
once (``_reduced``); with none left (or, in secure mode, fewer than ``min_sum_nodes`` nodes or
``min_batch`` samples) the server waits up to a TTL for the view to change and builds a new
schedule from the live nodes. A live node the schedule lacks (one that came after it was built,
or one taken out) is scheduled again from the next step (``_regrown``) once its signed record was
renewed after it was taken out: a dead node never renews it, a node that was slow once does
within a heartbeat. One that fails again before a step uses it waits 1, 3, 7, ... heartbeats more
(at most ``MAX_LEFT_OUT_S``), so a node that keeps failing costs few steps. Secure mode never
schedules a step before the pinned helper is live and sees enough of the nodes
(``_until_helper_sees``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from gossamer.protocols.tlpp import names
from gossamer.protocols.tlpp.core import (
    ChannelStats,
    TraversalError,
    VirtualBatchScheduler,
    pool_stats,
    read_stats,
)
from gossamer.protocols.tlpp.ledger import StepLedger

if TYPE_CHECKING:
    from gossamer.protocols.tlpp.server import TlppServerRole

log = logging.getLogger(__name__)
WAIT_POLL_S = 10.0
MAX_LEFT_OUT_S = 60.0


class Scheduling:
    """The scheduling half of ``TlppServerRole`` (see the module docstring)."""

    @property
    def _fewest(self: TlppServerRole) -> int:
        """The fewest nodes a schedule needs: secure mode's k (``min_sum_nodes``), else one."""
        return self.settings.min_sum_nodes if self.settings.secure else 1

    def _live(self: TlppServerRole, role: str) -> list[str]:
        return [p.record.peer_id for p in self.peers_with(role)]

    def _node_counts(self: TlppServerRole) -> dict[str, int]:
        return {peer: samples for peer, (samples, _) in self._nodes().items()}

    def _nodes(self: TlppServerRole) -> dict[str, tuple[int, ChannelStats | None]]:
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

    def _normalize(self: TlppServerRole) -> None:
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

    async def _schedule(self: TlppServerRole, wanted: int) -> VirtualBatchScheduler:
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

    async def _until_helper_sees(self: TlppServerRole, scheduler: VirtualBatchScheduler, wanted: int) -> VirtualBatchScheduler:
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

    async def _until_nodes_change(self: TlppServerRole, failed: set[str]) -> None:
        """Every scheduled node failed: give their records up to a TTL to expire (or others to
        come) instead of spending steps on nodes that are gone."""
        await self.ctx.until_view(lambda: set(self._node_counts()) != failed, timeout_s=self.ctx.manifest.ttl_s)

    def _helper_live(self: TlppServerRole) -> bool:
        return self.settings.helper in self._live(names.HELPER)

    async def _helper(self: TlppServerRole) -> str:
        """The helper the manifest pins, once it is live (never another peer with the role)."""
        while not self._helper_live():
            self.emit("waiting", nodes=len(self._node_counts()), wanted=1, helpers=0, helper_sees=None)
            await self.ctx.until_view(self._helper_live, timeout_s=WAIT_POLL_S)
        return self.settings.helper

    def _reduced(self: TlppServerRole, scheduler: VirtualBatchScheduler, ledger: StepLedger) -> VirtualBatchScheduler | None:
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

    def _regrown(self: TlppServerRole, scheduler: VirtualBatchScheduler) -> VirtualBatchScheduler:
        """The schedule with the live nodes it lacks whose records were renewed since they were
        taken out (see the module docstring); ``scheduler`` itself when there are none."""
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

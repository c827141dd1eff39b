"""One TL++ virtual batch, driven by the orchestrator over encrypted links to the nodes and the
helper (``StepDriver``): a node that fails is dropped from the step and the gradient is exactly that
of the nodes that completed; a helper that fails stops training (``HelperFailed``). The step in
base and secure mode is in ``protocols/tlpp/README.md``, "A step"."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gossamer.crypto.sharing import SharingError
from gossamer.peer.errors import PeerError
from gossamer.peer.kit.secure_link import LinkMessage, RequestRefused, SecureLinkError, SecureLinks
from gossamer.protocols.tlpp.core import VirtualBatch, affine_layer, orchestrator_step, sum_grads
from gossamer.protocols.tlpp.core.pacing import NodePacing
from gossamer.protocols.tlpp.core.secure import (
    HELPER,
    ORCHESTRATOR,
    PartyShare,
    gradient_layout,
    layout_numel,
    logit_bound,
    orchestrator_gradients,
    orchestrator_logit_gradients,
    party_logit_share,
    party_sum,
)
from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.settings import TlppSettings
from gossamer.protocols.tlpp.timing import request, run_phase
from gossamer.protocols.tlpp.wire import (
    ACT,
    BACKWARD,
    FORWARD,
    GRADS,
    HELPER_METHOD,
    LOGITS,
    NODE_METHOD,
    PING,
    SUM,
    ShareLog,
    check_party,
    check_tensors,
    flat_grads,
    used_nodes,
)

Checker = Callable[[int, str, LinkMessage], dict[str, Tensor]]
FaultPoint = Callable[[str, int], Awaitable[None]]


class TrainingStopped(PeerError):
    """TL++ training cannot go on (the message says why); the orchestrator stops the run."""


class HelperFailed(TrainingStopped):
    """The helper is unreachable, timed out or refused: secure mode cannot go on without it."""


@dataclass
class _Forwarded:
    act: Tensor  # float activations (base) or the orchestrator's int64 share (secure)
    labels: Tensor


class StepDriver:
    """Runs virtual batches for the orchestrator; holds which weight version each node has cached,
    which nodes the helper confirmed, and the node pacing (``core.pacing.NodePacing``)."""

    def __init__(self, *, settings: TlppSettings, model: nn.Sequential, node_side: nn.Module, orchestrator_side: nn.Module,
                 links: SecureLinks, share_log: ShareLog, device: torch.device, fault_point: FaultPoint) -> None:
        self.settings = settings
        self.fault_point = fault_point  # ``RoleContext.fault_point``: "backward", before its requests go out
        self.model, self.node_side, self.orchestrator_side = model, node_side, orchestrator_side
        self.links, self.share_log, self.device = links, share_log, device
        self.pacing = NodePacing(ceiling_s=settings.node_timeout_s, floor_s=settings.node_floor_s,
                                 adaptive=settings.pacing == "adaptive")
        self.version = 0
        self._cached: dict[str, int] = {}
        self._confirmed: tuple[str, set[str]] = ("", set())  # (helper, the nodes it said it sees)
        self._told = -1  # the latest step the helper heard of from this orchestrator
        self.kept: set[str] = set()  # rejected from the last step through no fault of their own: still scheduled
        self.batch: VirtualBatch | None = None  # the last step's virtual batch (a recheck reads its indices)
        self._weights: tuple[int, dict[str, Tensor]] | None = None
        self._params = {name: p.detach() for name, p in model.named_parameters()}
        self._node_params = {name: p.detach() for name, p in node_side.named_parameters()}
        with torch.no_grad():
            self.cut_shape = tuple(node_side(torch.zeros(1, *settings.input_shape, device=device)).shape[1:])
        if settings.secure:
            linear = affine_layer(orchestrator_side)
            self._affine_weight = linear.weight
            self._layout = gradient_layout(node_side, orchestrator_side)
            self._grads = flat_grads(layout_numel(self._layout))

    async def run(self, batch: VirtualBatch, ledger: StepLedger, helper: str | None) -> dict[str, Tensor] | None:
        """The step's summed gradients by parameter name, or None when nothing can be applied; the
        step's deadlines, and the nodes flagged slow at its end, in its ledger (``pacing``)."""
        ledger.deadline_s = self.pacing.deadlines()
        try:
            return await self._run(batch, ledger, helper)
        finally:
            ledger.slow = self.pacing.settle()

    async def _run(self, batch: VirtualBatch, ledger: StepLedger, helper: str | None) -> dict[str, Tensor] | None:
        plan, self.kept, self.batch = batch.by_node(), set(), batch
        ledger.planned = batch.sizes()
        ledger.expect(ledger.planned)
        if self.settings.secure:
            assert helper is not None
            plan = await self._seen_by_helper(ledger, plan, helper)
            if not plan:
                ledger.note = "the helper sees none of the step's nodes"
                return None
            short = self.settings.too_few(plan, {n: len(i) for n, i in plan.items()})
            if short:
                return self._give_up(ledger, f"not run: {short}")
        forwarded = await self._forward_all(ledger.step, plan, ledger, helper)
        if not forwarded:
            ledger.note = "no node answered the forward pass"
            return None
        if self.settings.secure:
            assert helper is not None
            return await self._secure(ledger, forwarded, helper)
        return await self._base(ledger, forwarded)

    def _give_up(self, ledger: StepLedger, note: str) -> None:
        """Apply nothing this step, for ``note``; the nodes still in it stay scheduled."""
        self.kept.update(ledger.give_up(note))

    # -- phase 0 (secure) -------------------------------------------------------------------------

    async def _seen_by_helper(self, ledger: StepLedger, plan: dict[str, list[int]],
                              helper: str) -> dict[str, list[int]]:
        """``plan`` without the nodes the helper does not see live (dropped from the ledger)."""
        confirmed = await self.confirm(helper, plan, step=ledger.step)
        for node in sorted(set(plan) - confirmed):
            ledger.drop(node, "helper", "the helper does not see this node as a live data node of the run")
        return {n: indices for n, indices in plan.items() if n in confirmed}

    async def confirm(self, helper: str, nodes: Iterable[str], *, step: int) -> set[str]:
        """Which of ``nodes`` the helper sees live: those it confirmed before, and the others
        asked with one ``ping`` (HelperFailed if the helper fails it)."""
        if self._confirmed[0] != helper:
            self._confirmed = (helper, set())
        confirmed, nodes = self._confirmed[1], set(nodes)
        unknown = sorted(nodes - confirmed)
        if not unknown and step > self._told + 1:
            unknown = sorted(nodes)  # only to announce the step: the helper's share window follows it
        if unknown:
            reply = await self._helper(helper, LinkMessage(PING, step, {"nodes": unknown}))
            confirmed.update(used_nodes(reply, dict.fromkeys(unknown)))
        return confirmed & nodes

    def forget(self, nodes: set[str]) -> None:
        """These nodes left the schedule: confirm them with the helper again if they come back."""
        self._confirmed[1].difference_update(nodes)

    # -- phase 1 --------------------------------------------------------------------------------

    def weights(self) -> dict[str, Tensor]:
        """The weights a node needs at the current version (node side; plus the orchestrator side in
        secure mode, for the affine layer's gradients), on the CPU."""
        if self._weights is None or self._weights[0] != self.version:
            modules = [self.node_side, self.orchestrator_side] if self.settings.secure else [self.node_side]
            state = {k: v.detach().cpu().clone() for m in modules for k, v in m.state_dict().items()}
            self._weights = (self.version, state)
        return self._weights[1]

    async def _forward_all(self, step: int, plan: dict[str, list[int]], ledger: StepLedger,
                           helper: str | None) -> dict[str, _Forwarded]:
        self.weights()  # built once before the requests go out: no node's measured time pays for it
        results = await run_phase(self.pacing, FORWARD, {n: self._forward_one(step, n, plan[n], helper) for n in plan})
        forwarded = {}
        for node, result in sorted(results.items()):
            if isinstance(result, _Forwarded):
                forwarded[node] = result
                ledger.arrive(node)
            elif isinstance(result, SecureLinkError | RequestRefused):
                self._cached.pop(node, None)
                ledger.drop(node, "forward", result)
                if isinstance(result, RequestRefused) and result.code == "step":  # a resumed orchestrator
                    self.kept.add(node)  # replays steps a secure node answered: it stays scheduled
            else:
                raise result
        return forwarded

    async def _forward_one(self, step: int, node: str, indices: list[int], helper: str | None) -> _Forwarded:
        fields = {"indices": indices, "version": self.version, "mode": self.settings.mode, "helper": helper or ""}
        stale = self._cached.get(node) != self.version
        try:
            reply = await self._node(node, LinkMessage(FORWARD, step, fields, self.weights() if stale else {}))
        except RequestRefused as exc:
            if exc.code != "stale" or stale:
                raise
            reply = await self._node(node, LinkMessage(FORWARD, step, fields, self.weights()))
        self._cached[node] = self.version
        return self._check_forward(step, node, len(indices), reply)

    def _check_forward(self, step: int, node: str, rows: int, reply: LinkMessage) -> _Forwarded:
        act_dtype = torch.int64 if self.settings.secure else torch.float32
        expected = {ACT: torch.empty((rows, *self.cut_shape), dtype=act_dtype),
                    "labels": torch.empty(rows, dtype=torch.int64)}
        check_tensors(reply.tensors, expected, what=f"forward reply of node {node[:12]}")
        labels = reply.tensors["labels"]
        classes = self.settings.num_classes
        if int(labels.min()) < 0 or int(labels.max()) >= classes:
            raise RequestRefused(f"node {node[:12]} sent labels outside [0, {classes})", code="malformed")
        if self.settings.secure:
            check_party(reply.fields, ORCHESTRATOR, what=f"forward reply of node {node[:12]}")
            self.share_log.record(step=step, node=node, tensors=[ACT], share_index=ORCHESTRATOR)
        return _Forwarded(act=reply.tensors[ACT], labels=labels)

    # -- base mode ------------------------------------------------------------------------------

    async def _base(self, ledger: StepLedger, forwarded: dict[str, _Forwarded]) -> dict[str, Tensor] | None:
        acts = {n: f.act.to(self.device) for n, f in forwarded.items()}
        labels = {n: f.labels.to(self.device) for n, f in forwarded.items()}
        top = await asyncio.to_thread(orchestrator_step, self.orchestrator_side, acts, labels)
        ledger.loss, ledger.accuracy = top.loss, top.correct / top.count
        messages = {n: LinkMessage(BACKWARD, ledger.step, {}, {"cut_grad": top.cut_grads[n]}) for n in forwarded}
        await self.fault_point("backward", ledger.step)
        grads = await self._backward_all(ledger, messages, self._check_base_grads)
        if not grads:
            ledger.note = "no node completed the backward pass"
            return None
        node_sum = sum_grads([grads[n] for n in sorted(grads)])
        orchestrator_grads, scale = top.orchestrator_grads, 1.0
        if len(grads) < len(forwarded):
            kept = sorted(grads)
            sub = await asyncio.to_thread(orchestrator_step, self.orchestrator_side, {n: acts[n] for n in kept},
                                          {n: labels[n] for n in kept})
            orchestrator_grads, scale = sub.orchestrator_grads, top.count / sub.count
        return {**{k: v.to(self.device) * scale for k, v in node_sum.items()}, **orchestrator_grads}

    def _check_base_grads(self, step: int, node: str, reply: LinkMessage) -> dict[str, Tensor]:
        check_tensors(reply.tensors, self._node_params, what=f"gradients of node {node[:12]}", dtype=torch.float32)
        return reply.tensors

    # -- secure mode ----------------------------------------------------------------------------

    async def _secure(self, ledger: StepLedger, forwarded: dict[str, _Forwarded],
                      helper: str) -> dict[str, Tensor] | None:
        settings, weight = self.settings, self._affine_weight
        sizes = {n: f.act.shape[0] for n, f in forwarded.items()}
        short = self.settings.too_few(forwarded, sizes)
        if short:
            return self._give_up(ledger, f"not run: of the nodes that answered the forward pass, {short}")
        reply = await self._helper(helper, LinkMessage(LOGITS, ledger.step, {"nodes": sorted(forwarded), "sizes": sizes},
                                                       {"weight": weight.detach().cpu()}))
        used = used_nodes(reply, forwarded)
        for node in sorted(set(forwarded) - set(used)):
            ledger.drop(node, "logits", "the helper holds no matching activation share")
        if not used:
            ledger.note = "the helper holds no activation share of any node that answered"
            return None
        short = self.settings.too_few(used, sizes)
        if short:  # the helper never answers such a share; nothing is reconstructed from one that does
            return self._give_up(ledger, f"not reconstructed: {short}")
        rows = sum(forwarded[n].act.shape[0] for n in used)
        check_tensors(reply.tensors, {"logits": torch.empty(rows, settings.num_classes, dtype=torch.int64)},
                      what="the helper's logit share")
        try:
            own = party_logit_share({n: PartyShare(ORCHESTRATOR, forwarded[n].act) for n in used}, self.orchestrator_side,
                                     max_abs=settings.max_abs, max_failure=settings.max_failure)
        except SharingError as exc:
            raise TrainingStopped(f"secure mode: the truncation guard refuses hyper.max_abs = {settings.max_abs} "
                                  f"with hyper.max_failure = {settings.max_failure}: {exc}") from exc
        try:
            logit_step = orchestrator_logit_gradients(own, PartyShare(HELPER, reply.tensors["logits"]),
                                                      {n: forwarded[n].labels for n in used},
                                                      bound=logit_bound(self.orchestrator_side, max_abs=settings.max_abs))
        except SharingError as exc:
            return self._give_up(ledger, f"step refused: {exc}")
        ledger.loss, ledger.accuracy = logit_step.loss, logit_step.correct / logit_step.count
        scale = float(logit_step.count)
        messages = {n: LinkMessage(BACKWARD, ledger.step, {"grad_scale": scale, "helper": helper},
                                   {"logit_grad": logit_step.logit_grads[n].to(torch.float32)}) for n in used}
        await self.fault_point("backward", ledger.step)
        shares = await self._backward_all(ledger, messages, self._check_grad_shares)
        if not shares:
            ledger.note = "no node completed the backward pass"
            return None
        short = self.settings.too_few(shares, sizes)
        if short:
            return self._give_up(ledger, f"not summed: {short}")
        helper_sum = await self._helper(helper, LinkMessage(SUM, ledger.step, {"nodes": sorted(shares)}))
        summed = used_nodes(helper_sum, shares)
        for node in sorted(set(shares) - set(summed)):
            ledger.drop(node, "sum", "the helper holds no gradient share")
        if not summed:
            return self._give_up(ledger, "the helper holds no gradient share of any node that completed the backward pass")
        short = self.settings.too_few(summed, sizes)
        if short:
            return self._give_up(ledger, f"not reconstructed: {short}")
        ledger.use(summed)
        ledger.samples = sum(ledger.planned.get(n, 0) for n in summed)
        check_tensors(helper_sum.tensors, self._grads, what="the helper's summed share")
        own_sum = party_sum([PartyShare(ORCHESTRATOR, shares[n][GRADS]) for n in summed])
        grads = orchestrator_gradients(own_sum, PartyShare(HELPER, helper_sum.tensors[GRADS]), layout=self._layout,
                                       grad_scale=scale)
        completed = sum(forwarded[n].act.shape[0] for n in summed)
        factor = rows / completed
        return {k: (v * factor).to(self._params[k].dtype).to(self.device) for k, v in grads.items()}

    def _check_grad_shares(self, step: int, node: str, reply: LinkMessage) -> dict[str, Tensor]:
        check_party(reply.fields, ORCHESTRATOR, what=f"gradient shares of node {node[:12]}")
        check_tensors(reply.tensors, self._grads, what=f"gradient shares of node {node[:12]}")
        self.share_log.record(step=step, node=node, tensors=[GRADS], share_index=ORCHESTRATOR)
        return reply.tensors

    # -- phase 3 and the remote calls ---------------------------------------------------------

    async def _backward_all(self, ledger: StepLedger, messages: Mapping[str, LinkMessage],
                            check: Checker) -> dict[str, dict[str, Tensor]]:
        results = await run_phase(self.pacing, BACKWARD, {n: self._node(n, messages[n]) for n in messages})
        done = {}
        for node, result in sorted(results.items()):
            try:
                if isinstance(result, BaseException):
                    raise result
                done[node] = check(ledger.step, node, result)
            except (SecureLinkError, RequestRefused) as exc:
                self._cached.pop(node, None)
                ledger.drop(node, "backward", exc)
        ledger.use(done)
        ledger.samples = sum(ledger.planned.get(n, 0) for n in done)
        return done

    async def _node(self, node: str, message: LinkMessage) -> LinkMessage:
        return await request(self.links, node, NODE_METHOD, message, timeout_s=self.settings.node_timeout_s)

    async def _helper(self, helper: str, message: LinkMessage) -> LinkMessage:
        self._told = max(self._told, message.step)
        try:
            return await request(self.links, helper, HELPER_METHOD, message, timeout_s=self.settings.helper_timeout_s)
        except (SecureLinkError, RequestRefused) as exc:
            raise HelperFailed(f"the helper {helper[:12]} failed during {message.op!r} of step {message.step}: {exc}; "
                               "secure training cannot go on without it") from exc


def grads_finite(grads: Mapping[str, Tensor]) -> bool:
    return all(bool(torch.isfinite(g).all()) for g in grads.values())

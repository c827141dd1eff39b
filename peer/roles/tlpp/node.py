"""Role ``node``: a TL++ data node. Its samples never leave it; it runs the layers below the cut.

The node checks its samples against the run's model input shape and classes when it starts (a
node whose data does not fit refuses to start, naming the shape the run expects), publishes how
many samples it holds (``assignment.tlpp_samples`` in its signed record; with ``data.normalize =
"nodes"`` also ``tlpp_stats``, its per-channel count, sums and sums of squares,
``protocols.tlpp.normalize``: never a sample) and answers only the run's orchestrator (the manifest owner's key), over ``peer.kit.secure_link``:

- ``forward`` {step, indices, version, mode, helper}: load the weights sent with it (the
  orchestrator sends them when the node's cached version is stale; a node asked to run a version
  it does not hold refuses with code "stale"), run the node side on the named samples and answer
  the cut activations and labels. Secure mode: check |A| <= max_abs, split A into two additive
  shares (``peer.tlpp_secure.node_share_activations``), start pushing share 1 to the helper the
  request names and answer share 0 to the orchestrator at once. A node that does not see the named
  helper live (waiting up to ``helper_wait_s``) refuses with code "helper" instead of answering a
  share it could not complete.
- ``backward`` {step}: for the step of the last forward, recompute the forward and
  backpropagate. Base mode: the cut-gradient slice in, the node-side gradients out. Secure mode:
  its own logit-gradient slice g_i in; the node-side and server-weight gradients, scaled by the
  public grad_scale, flattened into one vector and shared (``node_gradient_shares``); share 1
  pushed to the helper, share 0 answered at once.

**Pushes run beside the answer.** The helper waits (bounded, ``helper_wait_s``) for the shares an
orchestrator request names and answers which nodes it used, so the push need not finish before
the answer: a node whose push fails (the helper is not a live helper of the run, cannot be
reached or refuses) is simply absent from the helper's answer and the orchestrator leaves it out
of that phase. The failure is logged here; a helper that is really gone fails the orchestrator's
own request to it. Pushes to the helper go in order over one link; requests are handled one at a
time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from gossamer.crypto.sharing import MaskStream, SharingError
from gossamer.peer.kit.secure_link import (
    LinkMessage,
    RequestRefused,
    SecureLinkError,
    SecureLinks,
    SecureLinkServer,
)
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth, TcpGate, TcpMethod
from gossamer.peer.roles.tlpp import names
from gossamer.peer.roles.tlpp.data import default_node_source, load_run_data
from gossamer.peer.roles.tlpp.secure import node_gradient_shares, node_share_activations
from gossamer.peer.roles.tlpp.settings import TlppSettings
from gossamer.peer.roles.tlpp.wire import (
    ACT,
    BACKWARD,
    FORWARD,
    GRADS,
    HELPER_METHOD,
    NODE_METHOD,
    SHARE,
    check_indices,
    check_tensors,
)
from gossamer.protocols.tlpp import TraversalError, channel_stats, node_backward, node_forward

log = logging.getLogger(__name__)


def run_over(role: ProtocolRole, health: RoleHealth) -> RoleHealth:
    """``health``, or finished once the run's tlpp-server says training is finished (its record's
    ``assignment.tlpp_finished``): a node's or the helper's work ends with the run."""
    if health.state != FAILED and any(p.record.assignment.get("tlpp_finished") for p in role.peers_with(names.SERVER)):
        return RoleHealth(FINISHED, "the run's training is finished")
    return health


class TlppNodeRole(ProtocolRole[TlppSettings]):
    """A TL++ data node (see the module docstring)."""

    name = names.NODE

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        source = ctx.config.data or default_node_source(ctx.identity.peer_id, self.settings.num_shards)
        self.data = load_run_data(source, self.settings)
        self._assignment: dict[str, Any] = {"tlpp_samples": len(self.data)}
        if self.settings.normalize == "nodes":
            self._assignment["tlpp_stats"] = channel_stats(self.data.x).to_json()
        self.model = self.settings.build_model(ctx.device)
        self.node_side, self.server_side = self.settings.split(self.model)
        self._weights = {**self.node_side.state_dict(), **(self.server_side.state_dict() if self.settings.secure else {})}
        self._masks = MaskStream()
        self._links = SecureLinks(identity=ctx.identity, run_id=ctx.manifest.run_id, view=ctx.view, traffic=ctx.traffic)
        self._server = SecureLinkServer(identity=ctx.identity, run_id=ctx.manifest.run_id, method=NODE_METHOD,
                                        authorize=self._authorize, handler=self._handle, traffic=ctx.traffic)
        self._lock = asyncio.Lock()
        self.pushes_failed = 0
        self._pending: tuple[int, torch.Tensor] | None = None
        self.version = -1
        self.steps_served = 0
        self.last_step = -1
        log.info("TL++ node: %d samples from %s, %s mode, cut %d", len(self.data), source, self.settings.mode,
                 self.settings.cut)

    # -- role interface -------------------------------------------------------------------------

    def tcp_methods(self) -> dict[str, TcpMethod]:
        return self._server.tcp_methods()

    def tcp_gates(self) -> dict[str, TcpGate]:
        return self._server.tcp_gates()

    async def aclose(self) -> None:
        await super().aclose()
        await self._links.aclose()

    @property
    def round(self) -> int:
        return max(0, self.last_step + 1)

    def status(self) -> dict[str, Any]:
        return {"assignment": self._assignment, "data": self.data.source, "samples": len(self.data),
                "mode": self.settings.mode, "weights_version": self.version, "steps_served": self.steps_served,
                "pushes_failed": self.pushes_failed, "last_step": self.last_step}

    def health(self) -> RoleHealth:
        return run_over(self, super().health())

    # -- requests -------------------------------------------------------------------------------

    def _authorize(self, peer_id: str) -> bytes:
        if peer_id != self.ctx.manifest.owner_peer_id:
            raise RequestRefused(f"peer {peer_id[:12]} is not this run's orchestrator; only it may drive a data node")
        return self.ctx.manifest.owner_public_key

    async def _handle(self, peer_id: str, message: LinkMessage) -> LinkMessage:
        async with self._lock:
            if message.op == FORWARD:
                return await self._forward(message)
            if message.op == BACKWARD:
                return await self._backward(message)
            raise RequestRefused(f"a data node does not answer {message.op!r}")

    async def _forward(self, message: LinkMessage) -> LinkMessage:
        fields = message.fields
        if fields.get("mode") != self.settings.mode:
            raise RequestRefused(f"mode {fields.get('mode')!r} does not match the run's {self.settings.mode!r}")
        indices = check_indices(fields.get("indices"), len(self.data))
        helper = await self._helper_seen(fields) if self.settings.secure else ""
        self._load_weights(fields.get("version"), message.tensors)
        self._pending = None
        x, y = self.data.x[indices].to(self.ctx.device), self.data.y[indices]
        if not self.settings.secure:
            act = await asyncio.to_thread(node_forward, self.node_side, x)
            reply = LinkMessage(FORWARD, message.step, {}, {ACT: act, "labels": y})
        else:
            try:
                to_orchestrator, to_helper = await asyncio.to_thread(
                    node_share_activations, self.node_side, x, max_abs=self.settings.max_abs, masks=self._masks)
            except SharingError as exc:
                raise RequestRefused(str(exc), code="range") from exc
            self._push(helper, message.step, "act", {ACT: to_helper.ring})
            reply = LinkMessage(FORWARD, message.step, {"party": 0}, {ACT: to_orchestrator.ring, "labels": y})
        self._pending = (message.step, x)
        self.last_step = message.step
        return reply

    async def _helper_seen(self, fields: dict[str, object]) -> str:
        """The helper a secure forward names, once this node sees it live (waiting up to
        ``helper_wait_s``): the node answers only when it can push its share 1."""
        helper = _helper_named(fields)
        if not await self.ctx.until_view(lambda: self.live_with(helper, names.HELPER) is not None,
                                         timeout_s=self.settings.helper_wait_s):
            raise RequestRefused(f"helper {helper[:12]} is not a live helper of this run as this node sees it",
                                 code="helper")
        return helper

    def _load_weights(self, version: object, tensors: dict[str, torch.Tensor]) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise RequestRefused(f"version must be a non-negative integer, got {version!r}", code="malformed")
        if not tensors:
            if version != self.version:
                raise RequestRefused(f"stale weights: this node holds version {self.version}, the step needs "
                                     f"{version}", code="stale")
            return
        check_tensors(tensors, self._weights, what="weights")
        with torch.no_grad():
            for name, tensor in tensors.items():
                self._weights[name].copy_(tensor)
        self.version = version

    async def _backward(self, message: LinkMessage) -> LinkMessage:
        if self._pending is None or self._pending[0] != message.step:
            have = "none" if self._pending is None else self._pending[0]
            raise RequestRefused(f"backward for step {message.step}, but the last forward was step {have}", code="step")
        _, x = self._pending
        self._pending = None
        try:
            reply = await (self._secure_backward(message, x) if self.settings.secure else
                           self._base_backward(message, x))
        except (TraversalError, SharingError) as exc:
            raise RequestRefused(str(exc), code="malformed") from exc
        self.steps_served += 1
        return reply

    async def _base_backward(self, message: LinkMessage, x: torch.Tensor) -> LinkMessage:
        cut_grad = message.tensors.get("cut_grad")
        if cut_grad is None or set(message.tensors) != {"cut_grad"} or not cut_grad.is_floating_point():
            raise RequestRefused("backward needs exactly one float tensor 'cut_grad'", code="malformed")
        grads = await asyncio.to_thread(node_backward, self.node_side, x, cut_grad.to(self.ctx.device))
        return LinkMessage(BACKWARD, message.step, {}, grads)

    async def _secure_backward(self, message: LinkMessage, x: torch.Tensor) -> LinkMessage:
        logit_grad, scale = message.tensors.get("logit_grad"), message.fields.get("grad_scale")
        helper = _helper_named(message.fields)
        if logit_grad is None or set(message.tensors) != {"logit_grad"} or not logit_grad.is_floating_point():
            raise RequestRefused("backward needs exactly one float tensor 'logit_grad'", code="malformed")
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 1e6:
            raise RequestRefused(f"grad_scale must be a number in (0, 1e6], got {scale!r}", code="malformed")
        to_orchestrator, to_helper = await asyncio.to_thread(
            node_gradient_shares, self.node_side, self.server_side, x, logit_grad.to(self.ctx.device),
            masks=self._masks, grad_scale=float(scale))
        self._push(helper, message.step, "grad", {GRADS: to_helper.ring})
        return LinkMessage(BACKWARD, message.step, {"party": 0}, {GRADS: to_orchestrator.ring})

    def _push(self, helper: str, step: int, kind: str, tensors: dict[str, torch.Tensor]) -> None:
        """Start pushing share 1 to ``helper`` beside the answer (see the module docstring)."""
        self.spawn(self._push_or_note(helper, step, kind, tensors), name=f"push {kind} {step}")

    async def _push_or_note(self, helper: str, step: int, kind: str, tensors: dict[str, torch.Tensor]) -> None:
        """A push that fails is counted and logged, never a failure of the node: the helper then
        answers without this node, and the orchestrator leaves it out of that phase."""
        try:
            await self._to_helper(helper, step, kind, tensors)
        except RequestRefused as exc:
            self.pushes_failed += 1
            log.warning("TL++ node: %s", exc)

    async def _to_helper(self, helper: str, step: int, kind: str, tensors: dict[str, torch.Tensor]) -> None:
        """Push share 1 to the named helper; RequestRefused(code="helper") when it cannot be done."""
        timeout_s = self.settings.helper_timeout_s

        def is_helper() -> bool:
            live = self.ctx.view.get(helper)
            return live is not None and names.HELPER in live.record.roles

        if not await self.ctx.until_view(is_helper, timeout_s=timeout_s):
            raise RequestRefused(f"helper {helper[:12]} is not a live helper of this run", code="helper")
        try:
            await self._links.request(helper, HELPER_METHOD, LinkMessage(SHARE, step, {"kind": kind, "party": 1},
                                                                         tensors), timeout_s=timeout_s)
        except (SecureLinkError, RequestRefused) as exc:
            raise RequestRefused(f"helper {helper[:12]} did not take the {kind} shares of step {step}: {exc}",
                                 code="helper") from exc


def _helper_named(fields: dict[str, object]) -> str:
    helper = fields.get("helper")
    if not isinstance(helper, str) or not helper:
        raise RequestRefused("secure mode: the request names no helper", code="malformed")
    return helper

"""Role ``node``: a TL++ data node. Its samples never leave it; it runs the layers below the cut
for the run's orchestrator only (the manifest owner's key) and publishes how many samples it holds
(and, with ``data.normalize = "nodes"``, its per-channel sums) in its signed record. Its requests
and secure mode's own checks are in ``protocols/tlpp/README.md``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from gossamer.crypto.sharing import MaskStream, SharingError
from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.secure_link import (
    LinkMessage,
    RequestRefused,
    SecureLinkError,
    SecureLinks,
    SecureLinkServer,
)
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth, TcpGate, TcpMethod
from gossamer.protocols.tlpp import names
from gossamer.protocols.tlpp.core import (
    TraversalError,
    channel_stats,
    logit_gradient,
    node_backward,
    node_forward,
)
from gossamer.protocols.tlpp.core.secure import node_gradient_shares, node_share_activations
from gossamer.protocols.tlpp.data import default_node_source, load_run_data
from gossamer.protocols.tlpp.settings import TlppSettings, check_secure_admission, is_peer_id
from gossamer.protocols.tlpp.wire import (
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

log = logging.getLogger(__name__)
LOGIT_GRAD_SLACK = 1e-3  # |g_i - own g_i| * grad_scale allowed for the fixed-point logits (measured: <= 3.8e-5)


def run_over(role: ProtocolRole, health: RoleHealth) -> RoleHealth:
    """``health``, or finished once the run's orchestrator says training is finished (its record's
    ``assignment.tlpp_finished``): a node's or the helper's work ends with the run."""
    if health.state != FAILED and any(p.record.assignment.get("tlpp_finished") for p in role.peers_with(names.ORCHESTRATOR)):
        return RoleHealth(FINISHED, "the run's training is finished")
    return health


class TlppNodeRole(ProtocolRole[TlppSettings]):
    """A TL++ data node (``protocols/tlpp/README.md``, "Roles")."""

    name = names.NODE
    private_status = frozenset({"data"})  # where the owner's data lives is the owner's business

    def __init__(self, ctx: RoleContext, *, helper: str = "") -> None:
        super().__init__(ctx)
        self.helper = self._pinned(helper)
        source = ctx.config.data or default_node_source(ctx.identity.peer_id, self.settings.num_shards)
        self.data = load_run_data(source, self.settings)
        self._assignment: dict[str, Any] = {"tlpp_samples": len(self.data)}
        if self.settings.normalize == "nodes":
            self._assignment["tlpp_stats"] = channel_stats(self.data.x).to_json()
        self.model = self.settings.build_model(ctx.device)
        self.node_side, self.orchestrator_side = self.settings.split(self.model)
        above = self.orchestrator_side.state_dict() if self.settings.secure else {}
        self._weights = {**self.node_side.state_dict(), **above}
        self._masks = MaskStream()
        self._links = SecureLinks(identity=ctx.identity, run_id=ctx.manifest.run_id, view=ctx.view, traffic=ctx.traffic)
        self._server = SecureLinkServer(identity=ctx.identity, run_id=ctx.manifest.run_id, method=NODE_METHOD,
                                        authorize=self._authorize, handler=self._handle, traffic=ctx.traffic)
        self._lock = asyncio.Lock()
        self.pushes_failed = 0
        self._pending: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (step, x, y) of the last forward
        self.forwarded_step = -1  # the last step whose forward this node answered (steps only go up)
        self.version = -1
        self.steps_served = 0
        self.last_step = -1
        log.info("TL++ node: %d samples from %s, %s mode, cut %d", len(self.data), source, self.settings.mode,
                 self.settings.cut)

    def _pinned(self, helper: str) -> str:
        """The helper this data owner trusts (``gossamer node --helper``); ConfigError when it does not fit the run."""
        settings = self.settings
        if not settings.secure:
            if helper:
                raise ConfigError(f"--helper pins a helper, but run {self.ctx.manifest.run_id} trains in base mode: the "
                                  "cut activations would go in plaintext to the orchestrator; join it with "
                                  "`gossamer peer --roles node` if that is what you want")
            return ""
        check_secure_admission(settings, self.ctx.manifest.config.policy)
        if not is_peer_id(helper):
            raise ConfigError("secure mode: this data node trusts no helper; start it with `gossamer node --helper "
                              "PEER_ID`, the peer id of the helper you trust (its operator prints it with `gossamer "
                              f"identity show`), got {helper[:80]!r}")
        if helper != settings.helper:
            raise ConfigError(f"run {self.ctx.manifest.run_id} names helper {settings.helper[:16]}... (hyper.helper), "
                              f"not the one you trust ({helper[:16]}...): this node does not join it")
        return helper

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
        await self.ctx.fault_point("forward", message.step)  # a test's crash or stall before the step: nothing sent
        fields = message.fields
        if fields.get("mode") != self.settings.mode:
            raise RequestRefused(f"mode {fields.get('mode')!r} does not match the run's {self.settings.mode!r}")
        indices = check_indices(fields.get("indices"), len(self.data))
        if self.settings.secure:
            self._check_query(message.step, indices)
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
        self._pending = (message.step, x, y)
        self.last_step = message.step
        if self.settings.secure:
            self.forwarded_step = message.step
        return reply

    def _check_query(self, step: int, indices: list[int]) -> None:
        """Secure mode: one forward per step, steps going up, at most ``batch_size`` samples."""
        if step <= self.forwarded_step:
            raise RequestRefused(f"forward for step {step}: this node answered step {self.forwarded_step} already "
                                 "and answers one forward per step, steps going up", code="step")
        if len(indices) > self.settings.batch_size:
            raise RequestRefused(f"forward of {len(indices)} samples; a step has at most batch_size = "
                                 f"{self.settings.batch_size}", code="malformed")

    async def _helper_seen(self, fields: dict[str, object]) -> str:
        """The pinned helper, which the forward must name, once this node sees it live (waiting up
        to ``helper_wait_s``): the node answers only when it can push its share 1."""
        helper = self._helper_named(fields)
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

    def _helper_named(self, fields: dict[str, object]) -> str:
        """The pinned helper; RequestRefused(code="helper") for a request naming any other."""
        named = fields.get("helper")
        if named != self.helper:
            raise RequestRefused(f"the request names helper {str(named)[:12]!r}; this node trusts only its pinned "
                                 f"helper {self.helper[:12]}", code="helper")
        return self.helper

    async def _backward(self, message: LinkMessage) -> LinkMessage:
        if self._pending is None or self._pending[0] != message.step:
            have = "none" if self._pending is None else self._pending[0]
            raise RequestRefused(f"backward for step {message.step}, but the last forward was step {have}", code="step")
        _, x, y = self._pending
        self._pending = None
        try:
            reply = await (self._secure_backward(message, x, y) if self.settings.secure else
                           self._base_backward(message, x))
        except (TraversalError, SharingError) as exc:
            raise RequestRefused(str(exc), code="malformed") from exc
        await self.ctx.fault_point("backward", message.step)  # a test's crash mid-send: forward answered, not this
        self.steps_served += 1
        return reply

    async def _base_backward(self, message: LinkMessage, x: torch.Tensor) -> LinkMessage:
        cut_grad = message.tensors.get("cut_grad")
        if cut_grad is None or set(message.tensors) != {"cut_grad"} or not cut_grad.is_floating_point():
            raise RequestRefused("backward needs exactly one float tensor 'cut_grad'", code="malformed")
        grads = await asyncio.to_thread(node_backward, self.node_side, x, cut_grad.to(self.ctx.device))
        return LinkMessage(BACKWARD, message.step, {}, grads)

    async def _secure_backward(self, message: LinkMessage, x: torch.Tensor, y: torch.Tensor) -> LinkMessage:
        logit_grad, scale = message.tensors.get("logit_grad"), message.fields.get("grad_scale")
        helper = self._helper_named(message.fields)
        if logit_grad is None or set(message.tensors) != {"logit_grad"} or not logit_grad.is_floating_point():
            raise RequestRefused("backward needs exactly one float tensor 'logit_grad'", code="malformed")
        least = self.settings.smallest_batch
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not least <= scale <= 1e6:
            raise RequestRefused(f"grad_scale (the step's samples) must be a number in [min_batch = {least}, 1e6], got "
                                 f"{scale!r}", code="malformed")
        await asyncio.to_thread(self._check_logit_grad, x, y, logit_grad, float(scale))
        to_orchestrator, to_helper = await asyncio.to_thread(
            node_gradient_shares, self.node_side, self.orchestrator_side, x, logit_grad.to(self.ctx.device),
            masks=self._masks, grad_scale=float(scale))
        self._push(helper, message.step, "grad", {GRADS: to_helper.ring})
        return LinkMessage(BACKWARD, message.step, {"party": 0}, {GRADS: to_orchestrator.ring})

    def _check_logit_grad(self, x: torch.Tensor, y: torch.Tensor, logit_grad: torch.Tensor, scale: float) -> None:
        """RequestRefused unless ``logit_grad`` is this node's own (softmax - onehot) / scale, up to
        the fixed-point slack: recomputed from the weights of the forward and its labels."""
        rows = (x.shape[0], self.settings.num_classes)
        if tuple(logit_grad.shape) != rows:
            raise RequestRefused(f"logit_grad: shape {tuple(logit_grad.shape)}, but this node forwarded {rows[0]} "
                                 f"samples: expected {rows}", code="gradient")
        with torch.no_grad():
            logits = self.orchestrator_side(self.node_side(x)).double()
        _, own, _ = logit_gradient(logits, y.to(logits.device))
        own = own * logits.shape[0] / scale
        worst = float((logit_grad.to(own) - own).abs().max())
        if not worst * scale <= LOGIT_GRAD_SLACK:
            raise RequestRefused(f"logit_grad is not this node's own: it differs by {worst:.3g} from (softmax - onehot) "
                                 f"/ {scale:g} on this node's samples (slack {LOGIT_GRAD_SLACK / scale:.3g})",
                                 code="gradient")

    def _push(self, helper: str, step: int, kind: str, tensors: dict[str, torch.Tensor]) -> None:
        """Start pushing share 1 to ``helper`` beside the answer: a push that fails leaves this node out of
        the helper's answer, and so out of that phase (logged here)."""
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



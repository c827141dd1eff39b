"""One ring member's training step as a sans-I/O state machine (``RingMember``: messages in,
messages out), what a step's messages must look like (``ring_spec``), the sum of the members'
gradient shares (``reduce_gradients``, each first bounded by ``clip_shares``) and the one place
the model changes (``apply_update``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gossamer.protocols.context.core.blockwise import block_backward, block_forward, merge, output_delta
from gossamer.protocols.context.core.errors import InvalidRing, MessageRefused
from gossamer.protocols.context.core.model import coding_of
from gossamer.protocols.context.core.subspace import (
    BASIS_NAMES,
    basis_hash,
    project_basis_grads,
    retract_bases,
)
from gossamer.protocols.context.core.wire import (
    BACKWARD,
    FORWARD,
    KVMessage,
    MessageSpec,
    check_message,
    forward_to,
)
from gossamer.protocols.core.models import ByteTransformer


@dataclass(frozen=True)
class Outgoing:
    """A message for member ``to``."""

    to: int
    message: KVMessage


@dataclass(frozen=True)
class _Need:
    key: tuple[str, int, int, int | None]


Work = Generator[list[Outgoing] | _Need, KVMessage | None, None]


@dataclass
class _Layer:
    """What the backward of one layer needs from its forward."""

    x_in: Tensor
    q: Tensor
    k_coef: Tensor
    v_coef: Tensor
    index: Tensor | None
    out: Tensor
    lse: Tensor
    out_leaf: Tensor
    x_out: Tensor
    received: dict[int, KVMessage]


def _check_step_inputs(model: ByteTransformer, index: int, chunks: int, tokens: Tensor, targets: Tensor) -> None:
    if model.config.dropout:
        raise InvalidRing("dropout: ring members recompute blocks in the backward, so dropout must be 0")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise InvalidRing(f"chunks: must be a positive integer, got {chunks!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < chunks:
        raise InvalidRing(f"index: must be in [0, {chunks}), got {index!r}")
    if tokens.dim() != 2 or tokens.shape != targets.shape:
        raise InvalidRing(f"tokens: need [batch, chunk_tokens] tokens and targets, got {tuple(tokens.shape)} "
                          f"and {tuple(targets.shape)}")
    if tokens.shape[1] * chunks > model.config.context:
        raise InvalidRing(f"context: {chunks} chunks of {tokens.shape[1]} tokens exceed the model's "
                          f"context {model.config.context}")


def ring_spec(model: ByteTransformer, *, step: int, chunks: int, batch: int, tokens: int) -> MessageSpec:
    """What every message of ``step`` must look like for a ring of ``chunks`` members training
    ``model`` on [batch, chunks x tokens] sequences: a role can check a frame that arrives before
    its member for that step exists."""
    coding = coding_of(model.blocks[0].attn)
    return MessageSpec(step=step, chunks=chunks, layers=len(model.blocks), batch=batch, tokens=tokens,
                       heads=coding.n_heads, width=coding.width, mixtures=coding.mixtures,
                       dtype=model.embed.weight.dtype,
                       bases=tuple(basis_hash(block.attn, i) for i, block in enumerate(model.blocks)))


class RingMember:
    """Member ``index`` of a ring of ``chunks`` for one training step. Driving it::

        member = RingMember(model, index=p, chunks=P, step=s, tokens=x_p, targets=y_p)
        while not member.done:
            sends = member.step()    # one unit of compute; None while it waits for a message
            ...                      # send each Outgoing; for what arrives:
            member.deliver(msg)      # checks it (MessageRefused: refused, member unchanged)

    The driver passes a kv message on to ``forward_to(member, chunks)`` as it arrives, unchanged;
    ``deliver`` and ``step`` never run at the same time. ``loss`` is this chunk's share of the
    sequence loss, so the members' ``gradients()`` sum to the whole sequence's gradient; a member
    never touches the model's parameters or ``.grad``."""

    def __init__(self, model: ByteTransformer, *, index: int, chunks: int, step: int, tokens: Tensor,
                 targets: Tensor) -> None:
        _check_step_inputs(model, index, chunks, tokens, targets)
        self.model, self.index, self.chunks, self.step_number = model, index, chunks, step
        self.device = model.embed.weight.device
        self.tokens, self.targets = tokens.to(self.device), targets.to(self.device)
        self._codings = [coding_of(block.attn) for block in model.blocks]
        self.spec = ring_spec(model, step=step, chunks=chunks, batch=tokens.shape[0], tokens=tokens.shape[1])
        self.loss: Tensor | None = None
        self.done = False
        self._grads: dict[str, Tensor] = {}
        self._inbox: dict[tuple, KVMessage] = {}
        self._seen: set[tuple] = set()
        self._need: tuple | None = None
        self._work = self._run()

    # --- the driver's side ------------------------------------------------------------------

    def deliver(self, message: KVMessage) -> None:
        """Take one arrived message; ``MessageRefused`` (this member unchanged) when it fails a check
        or is not this member's to take. Passing kv messages on is the driver's (``forward_to``)."""
        check_message(message, self.spec)
        if message.key in self._seen:
            raise MessageRefused(f"order: {message.key} already arrived", code="order")
        if message.kind == FORWARD and not message.owner < self.index:
            raise MessageRefused(f"order: member {self.index} needs no keys of chunk {message.owner} (causal)",
                                 code="order")
        if message.kind == BACKWARD and not (message.owner == self.index and message.user > self.index):
            raise MessageRefused(f"order: a gradient for chunk {message.owner} from member {message.user} is "
                                 f"not member {self.index}'s to take", code="order")
        self._seen.add(message.key)
        self._inbox[message.key] = message.to(self.device)

    def step(self) -> list[Outgoing] | None:
        """Do one unit of work and return what to send; None (nothing done) while a message is missing."""
        if self.done:
            return None
        value = None
        if self._need is not None:
            if self._need not in self._inbox:
                return None
            value, self._need = self._inbox.pop(self._need), None
        try:
            out = self._work.send(value)
        except StopIteration:
            self.done = True
            return []
        if isinstance(out, _Need):
            self._need = out.key
            return []
        return out

    @property
    def waiting_for(self) -> tuple | None:
        """The (kind, layer, owner, user) of the message this member waits for, if any."""
        return self._need if self._need not in self._inbox else None

    def gradients(self) -> dict[str, Tensor]:
        """This member's share of every parameter's gradient, by name (zeros where it has none)."""
        if not self.done:
            raise InvalidRing("gradients: the step is not finished")
        return {name: self._grads.get(name, torch.zeros_like(p)) for name, p in self.model.named_parameters()}

    # --- the step ---------------------------------------------------------------------------

    def _run(self) -> Work:
        model = self.model
        with torch.enable_grad():
            length = self.tokens.shape[1]
            positions = torch.arange(self.index * length, (self.index + 1) * length, device=self.device)
            x0 = model.drop(model.embed(self.tokens) + model.pos(positions))
        x, layers = x0, []
        for number in range(len(model.blocks)):
            layer = yield from self._forward_layer(number, x)
            layers.append(layer)
            x = layer.x_out
        grad = self._top_backward(x)
        yield []
        for number in reversed(range(len(model.blocks))):
            grad = yield from self._backward_layer(number, layers[number], grad)
        self._accumulate(torch.autograd.grad(x0, [model.embed.weight, model.pos.weight], grad),
                         ["embed.weight", "pos.weight"])

    def _message(self, kind: str, layer: int, owner: int, user: int | None, k: Tensor, v: Tensor,
                 index: Tensor | None) -> KVMessage:
        return KVMessage(kind, self.step_number, layer, owner, user, self.spec.bases[layer], k, v, index)

    def _forward_layer(self, number: int, x: Tensor) -> Generator:
        block, coding = self.model.blocks[number], self._codings[number]
        x_in = x.detach().requires_grad_()
        with torch.enable_grad():
            q, k_coef, v_coef, index = coding.project(block.ln1(x_in))
        index = None if index is None else index.to(torch.uint8)
        own = self._message(FORWARD, number, self.index, None, k_coef.detach(), v_coef.detach(), index)
        target = forward_to(self.index, self.chunks)
        yield [] if target is None else [Outgoing(target, own)]
        q_data = q.detach()
        acc = block_forward(q_data, *coding.rebuild(own.k, own.v, own.index), causal=True)
        yield []
        received: dict[int, KVMessage] = {}
        for owner in reversed(range(self.index)):
            message = yield _Need((FORWARD, number, owner, None))
            received[owner] = message
            acc = merge(acc, block_forward(q_data, *coding.rebuild(message.k, message.v, message.index),
                                           causal=False))
            yield []
        out, lse = acc
        batch, heads, length, d_head = out.shape
        out_leaf = out.transpose(1, 2).reshape(batch, length, heads * d_head).requires_grad_()
        with torch.enable_grad():
            h = x_in + block.drop(coding.proj(out_leaf))
            x_out = h + block.drop(block.mlp(block.ln2(h)))
        return _Layer(x_in, q, k_coef, v_coef, index, out, lse, out_leaf, x_out, received)

    def _top_backward(self, x: Tensor) -> Tensor:
        model = self.model
        x_leaf = x.detach().requires_grad_()
        with torch.enable_grad():
            h = model.norm_f(x_leaf)
            logits = F.linear(h, model.embed.weight) if model.head is None else model.head(h)
            total = self.tokens.numel() * self.chunks
            flat = logits.flatten(0, 1)
            flat = flat.to(torch.promote_types(flat.dtype, torch.float32))
            loss = F.cross_entropy(flat, self.targets.flatten(), reduction="sum") / total
        self.loss = loss.detach()
        names = [n for n, _ in model.named_parameters() if n.startswith(("norm_f.", "head.", "embed."))]
        params = dict(model.named_parameters())
        grads = torch.autograd.grad(loss, [x_leaf, *(params[n] for n in names)], allow_unused=True)
        self._accumulate(grads[1:], names)
        return grads[0]

    def _backward_layer(self, number: int, layer: _Layer, grad: Tensor) -> Generator:
        block, coding = self.model.blocks[number], self._codings[number]
        prefix = f"blocks.{number}."
        post = [(n, p) for n, p in block.named_parameters() if n.startswith(("attn.proj.", "ln2.", "mlp."))]
        grads = torch.autograd.grad(layer.x_out, [layer.x_in, layer.out_leaf, *(p for _, p in post)], grad)
        self._accumulate(grads[2:], [prefix + n for n, _ in post])
        residual = grads[0]
        batch, length, _ = grads[1].shape
        dout = grads[1].view(batch, length, coding.n_heads, coding.d_head).transpose(1, 2)
        delta = output_delta(layer.out, dout)
        q_data = layer.q.detach()
        dq = torch.zeros_like(q_data)
        yield []
        own_message = (layer.k_coef.detach(), layer.v_coef.detach(), layer.index)
        own_grads = None
        for owner in range(self.index + 1):
            if owner == self.index:
                k_coef, v_coef, index = own_message
            else:
                received = layer.received[owner]
                k_coef, v_coef, index = received.k, received.v, received.index
            k, v = coding.rebuild(k_coef, v_coef, index)
            dq_block, dk, dv = block_backward(q_data, k, v, dout, layer.lse, delta, causal=owner == self.index)
            dq += dq_block
            dk_coef, dv_coef, basis_grads = coding.coef_backward(k_coef, v_coef, index, dk, dv)
            self._accumulate(list(basis_grads.values()), [f"{prefix}attn.{n}" for n in basis_grads])
            if owner == self.index:
                own_grads = [dk_coef, dv_coef]
                yield []
            else:
                yield [Outgoing(owner, self._message(BACKWARD, number, owner, self.index, dk_coef, dv_coef, None))]
        assert own_grads is not None
        for user in range(self.index + 1, self.chunks):
            message = yield _Need((BACKWARD, number, self.index, user))
            own_grads[0] = own_grads[0] + message.k
            own_grads[1] = own_grads[1] + message.v
        pre = [(n, p) for n, p in block.named_parameters()
               if n.startswith(("ln1.", "attn.")) and not n.startswith("attn.proj.")
               and n.rsplit(".", 1)[-1] not in BASIS_NAMES]
        grads = torch.autograd.grad([layer.q, layer.k_coef, layer.v_coef], [layer.x_in, *(p for _, p in pre)],
                                    [dq, *own_grads], allow_unused=True)
        self._accumulate(grads[1:], [prefix + n for n, _ in pre])
        yield []
        return residual + grads[0]

    def _accumulate(self, grads, names) -> None:
        for name, grad in zip(names, grads, strict=True):
            if grad is None:
                continue
            have = self._grads.get(name)
            self._grads[name] = grad.detach().clone() if have is None else have + grad


def reduce_gradients(members: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The step's gradient: every member's share summed, in member order (InvalidRing when the
    members disagree on names or shapes)."""
    if not members:
        raise InvalidRing("gradients: need at least one member's")
    names = set(members[0])
    total = {name: grad.clone() for name, grad in members[0].items()}
    for i, grads in enumerate(members[1:], start=1):
        if set(grads) != names:
            raise InvalidRing(f"gradients: member {i} has other parameter names than member 0")
        for name, grad in grads.items():
            if grad.shape != total[name].shape:
                raise InvalidRing(f"gradients: {name} of member {i} is {tuple(grad.shape)}, expected "
                                  f"{tuple(total[name].shape)}")
            total[name] += grad
    return total


def share_norm(share: dict[str, Tensor]) -> float:
    """The global L2 norm of one member's gradient share (float64)."""
    return float(torch.sqrt(sum((g.detach().to(torch.float64) ** 2).sum() for g in share.values())))


def clip_shares(members: list[dict[str, Tensor]], factor: float) -> tuple[list[dict[str, Tensor]], dict[int, float]]:
    """Each member's share scaled down to ``factor`` x the lower median of the shares' norms (0:
    none touched), and {index: norm before} of those scaled. A member that sends a large share (a
    Byzantine one, or a sign-flipped x20) then moves the step at most ``factor`` x as far as a
    typical honest share does: fewer than half the members can neither raise the median nor, with
    factor 1, outweigh the honest ones. Shares at or under the bound are passed on untouched."""
    if not factor or len(members) < 2:
        return members, {}
    norms = [share_norm(share) for share in members]
    bound = factor * sorted(norms)[(len(norms) - 1) // 2]
    clipped = {i: norm for i, norm in enumerate(norms) if norm > bound}
    return [{name: g * (bound / norms[i]) for name, g in share.items()} if i in clipped else share
            for i, share in enumerate(members)], clipped


def apply_update(model: nn.Module, optimizer: torch.optim.Optimizer, grads: dict[str, Tensor], *,
                 grad_clip: float | None = 1.0) -> float:
    """One optimizer step from the reduced gradient: basis gradients projected onto their tangent
    spaces, the whole gradient clipped to ``grad_clip``, the step, then the QR retraction that keeps
    every basis orthonormal. Returns the gradient norm before clipping."""
    for name, param in model.named_parameters():
        param.grad = grads[name].to(param.device, param.dtype).clone()
    project_basis_grads(model)
    params = [p for p in model.parameters() if p.grad is not None]
    norm = float(nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else float("inf")))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    retract_bases(model)
    return norm

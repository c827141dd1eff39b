"""The data plane of a block server: ``BlockHost`` checks a route frame (blocks falling from hop to
hop, z and the context well formed, at most ``max_batch`` sequences) and applies its blocks' Euler
steps before the ``RouteHost`` skeleton forwards z or answers it."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from functools import partial

import torch

from gossamer.peer.route.host import RouteHost, Tensors
from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import Hop, expect_tensor, result_frame
from gossamer.protocols.blocktrain.core import BlockStack, BlockTrainConfig, denoise_step
from gossamer.transport.frames import Frame
from gossamer.transport.limits import DEFAULT_LIMITS, Limits
from gossamer.transport.tcp import HandlerError

METHOD = "blocktrain.traverse"
EMBEDDING_METHOD = "blocktrain.embedding"


def max_route_payload_bytes(config: BlockTrainConfig, max_batch: int) -> int:
    """The largest payload a route frame can need: z (float32) and the context (int64) of
    ``max_batch`` sequences of ``config.context`` positions. The TCP gate refuses bigger ones
    before a byte of them is read."""
    return max_batch * config.context * (config.d_model * 4 + 8)


class BlockHost(RouteHost):
    """Answers ``blocktrain.traverse`` frames with the blocks of ``stack`` it holds."""

    method = METHOD
    unit_name = "block"

    def __init__(self, stack: BlockStack, blocks: tuple[int, ...], *, run_id: str, pool: HopPool,
                 next_hop_ok: Callable[[Hop], Awaitable[str | None]], max_batch: int = 64,
                 max_inflight: int = 2, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(run_id=run_id, units=blocks, pool=pool, next_hop_ok=next_hop_ok, max_batch=max_batch,
                         max_inflight=max_inflight, limits=limits)
        self.stack = stack

    def embedding_frame(self) -> Frame:
        """E, for a client's readout (``blocktrain.embedding``)."""
        return result_frame({name: t.detach().cpu() for name, t in self.stack.embedding_state().items()})

    def check_route(self, route: tuple[Hop, ...]) -> None:
        units = [k for hop in route for k in hop.units]
        num_blocks = self.stack.config.num_blocks
        if any(not 0 <= k < num_blocks for k in units) or any(a <= b for a, b in itertools.pairwise(units)):
            raise HandlerError(f"route blocks {units[:16]} must fall strictly from one step to the next, "
                               f"within 0..{num_blocks - 1}")

    def check_inputs(self, hop: Hop, tensors: Tensors) -> Tensors:
        config = self.stack.config
        z = expect_tensor(tensors, "z", dtype=torch.float32, ndim=3)
        context = expect_tensor(tensors, "context", dtype=torch.int64, ndim=2)
        extra = sorted(set(tensors) - {"z", "context"})
        if extra:
            raise HandlerError(f"malformed route frame: unexpected tensors {extra[:8]}")
        batch, length = context.shape
        if tuple(z.shape) != (batch, length, config.d_model):
            raise HandlerError(f"malformed route frame: z has shape {tuple(z.shape)}, expected "
                               f"{(batch, length, config.d_model)} for context {(batch, length)}")
        self.check_batch(batch, length, config.context)
        if not bool(torch.isfinite(z).all()):
            raise HandlerError("malformed route frame: z holds NaN or Inf")
        if int(context.min()) < 0 or int(context.max()) >= config.vocab:
            raise HandlerError(f"malformed route frame: context ids must lie in [0, {config.vocab})")
        return {"z": z, "context": context}

    def computation(self) -> Callable[[tuple[int, ...], Tensors], Tensors]:
        return partial(_apply, self.stack)

    def answer(self, outputs: Tensors) -> Tensors:
        return {"z": outputs["z"]}


def _apply(stack: BlockStack, blocks: tuple[int, ...], inputs: Tensors) -> Tensors:
    device = stack.embed.weight.device
    context, z = inputs["context"].to(device), inputs["z"].to(device)
    for k in blocks:
        z = denoise_step(stack, k, context, z)
    return {"z": z.to("cpu").contiguous(), "context": inputs["context"]}

"""``RouteHost``: what every host of a route does with a frame: check it (run, route, units, tensors),
compute in a worker thread, refuse a non-finite result, then answer or forward it to a next hop
the policy allows. Subclasses say what a unit is (README.md of peer, "route.host")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import torch

from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import Hop, failed_hop_frame, parse_request, result_frame
from gossamer.transport.frames import Frame
from gossamer.transport.limits import DEFAULT_LIMITS, Limits
from gossamer.transport.tcp import HandlerError

Tensors = dict[str, torch.Tensor]


class RouteHost:
    """The skeleton (see the module docstring); ``method`` is the TCP method it answers."""

    method = ""

    def __init__(self, *, run_id: str, units: tuple[int, ...], pool: HopPool,
                 next_hop_ok: Callable[[Hop], Awaitable[str | None]], max_batch: int = 64,
                 max_inflight: int = 2, limits: Limits = DEFAULT_LIMITS) -> None:
        self.run_id = run_id
        self.units = tuple(units)
        self.max_batch = max_batch
        self.served = 0
        self.refused = 0
        self._pool = pool
        self._next_hop_ok = next_hop_ok
        self._limits = limits
        self._slots = asyncio.Semaphore(max_inflight)

    async def handle(self, frame: Frame) -> Frame:
        """Apply this host's units to a route frame and answer (or forward and relay)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            request = parse_request(frame, limits=self._limits)
            if request.run_id != self.run_id:
                raise HandlerError(f"route request for run {request.run_id[:80]!r}; this host serves run "
                                   f"{self.run_id}")
            hop = request.route[0]
            foreign = [u for u in hop.units if u not in self.units]
            if foreign:
                raise HandlerError(f"this host does not serve {self.unit_name}(s) {foreign[:8]} "
                                   f"(it serves {list(self.units)})")
            self.check_route(request.route)
            inputs = self.check_inputs(hop, request.tensors)
        except HandlerError:
            self.refused += 1
            raise
        compute = self.computation()  # taken now: a refresh may swap weights; this request keeps its own
        async with self._slots:
            if loop.time() - started >= request.budget_s:
                raise HandlerError("the route's time budget ran out while this host was busy")
            outputs = await asyncio.to_thread(compute, hop.units, inputs)
        if not all(bool(torch.isfinite(t).all()) for t in outputs.values() if t.is_floating_point()):
            self.refused += 1
            raise HandlerError(f"these inputs drive {self.unit_name}(s) {list(hop.units)} to NaN or Inf; refused")
        self.served += 1
        rest = request.route[1:]
        if not rest:
            return result_frame(self.answer(outputs))
        reason = await self._next_hop_ok(rest[0])
        if reason is not None:
            return failed_hop_frame(rest[0].addr, reason)
        return await self._pool.call(self.method, run_id=self.run_id, request_id=request.request_id,
                                     route=rest, tensors=outputs,
                                     budget_s=request.budget_s - (loop.time() - started))

    def check_batch(self, batch: int, length: int, context: int) -> None:
        """HandlerError unless 1..max_batch sequences of 1..context positions."""
        if not 1 <= batch <= self.max_batch or not 1 <= length <= context:
            raise HandlerError(f"malformed route frame: {batch} sequence(s) of {length} positions; this "
                               f"host takes 1..{self.max_batch} sequences of 1..{context}")

    # -- what a subclass says -------------------------------------------------------------------

    unit_name = "unit"

    def check_route(self, route: tuple[Hop, ...]) -> None:
        raise NotImplementedError

    def check_inputs(self, hop: Hop, tensors: Tensors) -> Tensors:
        raise NotImplementedError

    def computation(self) -> Callable[[tuple[int, ...], Tensors], Tensors]:
        """``compute(units, inputs) -> outputs``, bound to the current weights."""
        raise NotImplementedError

    def answer(self, outputs: Tensors) -> Tensors:
        """What the last hop sends back to the client (default: everything it computed)."""
        return outputs

"""Route frames: a REQUEST names the run, the route still to go (hops of ``host:port`` and units) and
the budget left, with the tensors; a RESPONSE carries the result or ``failed_hop`` (which hop and
why). A malformed request is a ``HandlerError`` (README.md of peer, "route.wire")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gossamer.transport.codec import decode_tensors, encode_tensors
from gossamer.transport.errors import DecodeError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.limits import DEFAULT_LIMITS, Limits
from gossamer.transport.tcp import HandlerError

MAX_ROUTE_HOPS = 64
MAX_UNITS = 1024
MAX_REQUEST_ID_CHARS = 64
MAX_ADDR_CHARS = 300
MAX_REASON_CHARS = 500


@dataclass(frozen=True)
class Hop:
    """One host of a route: its TCP address and the units it applies, in order."""

    addr: str
    units: tuple[int, ...]

    def to_wire(self) -> list[Any]:
        return [self.addr, list(self.units)]


@dataclass(frozen=True)
class RouteRequest:
    """A decoded, checked route request (see the module docstring)."""

    method: str
    run_id: str
    request_id: str
    route: tuple[Hop, ...]
    budget_s: float
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class FailedHop:
    """The answer "hop ``addr`` failed": the client routes around it."""

    addr: str
    reason: str


def request_frame(method: str, *, run_id: str, request_id: str, route: tuple[Hop, ...], budget_s: float,
                  tensors: Mapping[str, torch.Tensor]) -> Frame:
    """The REQUEST frame for the first hop of ``route``."""
    entries, buffers = encode_tensors(tensors)
    header = {"method": method, "run": run_id, "request": request_id,
              "route": [hop.to_wire() for hop in route], "budget_s": float(budget_s), "tensors": entries}
    return Frame(FrameType.REQUEST, header, buffers)


def parse_request(frame: Frame, *, limits: Limits = DEFAULT_LIMITS) -> RouteRequest:
    """Decode and check a request's header and tensors; HandlerError names what is wrong."""
    header = frame.header
    method, run_id, request_id = header.get("method"), header.get("run"), header.get("request")
    if not isinstance(run_id, str) or not run_id:
        raise HandlerError("malformed route frame: field 'run' must be a non-empty string")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
        raise HandlerError(f"malformed route frame: field 'request' must be 1-{MAX_REQUEST_ID_CHARS} "
                           "characters")
    budget = header.get("budget_s")
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 < budget < math.inf:
        raise HandlerError(f"malformed route frame: field 'budget_s' must be a positive number, "
                           f"got {budget!r}")
    route = parse_route(header.get("route"))
    try:
        tensors = decode_tensors(header.get("tensors"), frame.payload, limits=limits)
    except DecodeError as exc:
        raise HandlerError(f"malformed route frame: {exc}") from exc
    return RouteRequest(method=str(method), run_id=run_id, request_id=request_id, route=route,
                            budget_s=float(budget), tensors=tensors)


def parse_route(route: object) -> tuple[Hop, ...]:
    """The route field as hops; HandlerError when it is not a non-empty list of [addr, [int, ...]]."""
    if not isinstance(route, list) or not 0 < len(route) <= MAX_ROUTE_HOPS:
        raise HandlerError(f"malformed route frame: field 'route' must be a list of 1-{MAX_ROUTE_HOPS} "
                           "hops")
    hops = []
    for index, hop in enumerate(route):
        ok = isinstance(hop, list) and len(hop) == 2 and isinstance(hop[0], str) and isinstance(hop[1], list)
        if not ok or not 0 < len(hop[0]) <= MAX_ADDR_CHARS or not 0 < len(hop[1]) <= MAX_UNITS:
            raise HandlerError(f"malformed route frame: route hop {index} must be "
                               "[\"host:port\", [unit, ...]]")
        if not all(isinstance(u, int) and not isinstance(u, bool) for u in hop[1]):
            raise HandlerError(f"malformed route frame: route hop {index} has a unit that is not an "
                               "integer")
        hops.append(Hop(addr=hop[0], units=tuple(hop[1])))
    return tuple(hops)


def expect_tensor(tensors: Mapping[str, torch.Tensor], name: str, *, dtype: torch.dtype,
                  ndim: int) -> torch.Tensor:
    """``tensors[name]``, which must exist with ``dtype`` and ``ndim`` dimensions; HandlerError otherwise."""
    tensor = tensors.get(name)
    if tensor is None:
        raise HandlerError(f"malformed route frame: tensor {name!r} is missing "
                           f"(got {sorted(tensors)[:8]})")
    if tensor.dtype != dtype or tensor.dim() != ndim:
        raise HandlerError(f"malformed route frame: tensor {name!r} must be {ndim}-D {dtype}, "
                           f"got {tuple(tensor.shape)} {tensor.dtype}")
    return tensor


def result_frame(tensors: Mapping[str, torch.Tensor]) -> Frame:
    entries, buffers = encode_tensors(tensors)
    return Frame(FrameType.RESPONSE, {"tensors": entries}, buffers)


def failed_hop_frame(addr: str, reason: str) -> Frame:
    return Frame(FrameType.RESPONSE, {"failed_hop": addr, "reason": reason[:MAX_REASON_CHARS]})


def parse_answer(frame: Frame, *, limits: Limits = DEFAULT_LIMITS) -> dict[str, torch.Tensor] | FailedHop:
    """Result tensors or a FailedHop; DecodeError when the answer is neither."""
    failed = frame.header.get("failed_hop")
    if failed is not None:
        reason = frame.header.get("reason")
        if not isinstance(failed, str) or not isinstance(reason, str):
            raise DecodeError("malformed route answer: 'failed_hop' and 'reason' must be strings")
        return FailedHop(addr=failed[:MAX_ADDR_CHARS], reason=reason[:MAX_REASON_CHARS])
    return decode_tensors(frame.header.get("tensors"), frame.payload, limits=limits, require_finite=True)

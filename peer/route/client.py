"""The client side of a route: ``route_through`` (pure) covers the units with as few hops as the
announced, dialable hosts allow; ``RemoteRoute`` sends along it and, when a hop fails, routes
again without that host; ``RouteFailed`` / ``NoReachableHost`` when no host is left for a unit."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

from gossamer.peer.errors import PeerError
from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import FailedHop, Hop, parse_answer
from gossamer.peer.run.view import PeerView
from gossamer.transport.errors import DecodeError

log = logging.getLogger(__name__)
REREAD_PAUSE_S = 0.1


class RouteFailed(PeerError):
    """A route request could not be completed: no live host is left for some unit, or every try failed."""


class NoReachableHost(RouteFailed):
    """The only live hosts of some unit are private peers no relay reaches: nobody can dial them."""


@dataclass(frozen=True)
class HostEntry:
    """A host announcing ``units`` at TCP address ``addr``; ``reachable``: others can dial it."""

    peer_id: str
    addr: str
    units: tuple[int, ...]
    reachable: bool = True


def hosts_from_view(view: PeerView, *, now: float, role: str, key: str) -> list[HostEntry]:
    """Live peers with ``role`` and the units they announce under ``assignment[key]`` (the private
    ones too, marked: a route leaves them out, and says so)."""
    hosts = []
    for peer in view.live(now=now):
        record = peer.record
        units = record.assignment.get(key)
        if role in record.roles and record.tcp_addr and isinstance(units, list) \
                and all(isinstance(u, int) and not isinstance(u, bool) for u in units):
            hosts.append(HostEntry(peer_id=record.peer_id, addr=record.tcp_addr, units=tuple(units),
                                   reachable=record.reachable))
    return hosts


def route_through(order: Sequence[int], hosts: Sequence[HostEntry], *,
                  exclude: Collection[str] = ()) -> tuple[Hop, ...]:
    """Hops covering ``order`` (see the module docstring); RouteFailed naming the unit nobody holds."""
    usable = sorted((h for h in hosts if h.addr not in exclude and h.reachable), key=lambda h: h.peer_id)
    hops: list[Hop] = []
    position = 0
    while position < len(order):
        best, best_run = None, 0
        for host in usable:
            run = 0
            while position + run < len(order) and order[position + run] in host.units:
                run += 1
            if run > best_run:
                best, best_run = host, run
        if best is None:
            unit = order[position]
            private = sorted(h.addr for h in hosts if not h.reachable and unit in h.units and h.addr not in exclude)
            if private:
                raise NoReachableHost(f"unit {unit} is held only by private host(s) {', '.join(private)}: "
                                      f"no relay reaches them, so nobody can dial them")
            raise RouteFailed(f"no live host serves unit {unit} "
                              f"({len(usable)} usable host(s), {len(exclude)} excluded)")
        hops.append(Hop(addr=best.addr, units=tuple(order[position:position + best_run])))
        position += best_run
    return tuple(hops)


class RemoteRoute:
    """Route requests of one kind (``method``, units in ``order``) over the hosts ``hosts(refresh)`` returns.

    A host that failed is avoided for ``avoid_s`` seconds (its record may outlive it by up to a TTL);
    ``failures`` keeps the last reason of every host that failed, ``unreachable`` the private hosts
    (peer id: address) left out of its routes. Each attempt may take ``budget_s`` to find a route
    and ``budget_s`` to go along it.
    """

    def __init__(self, *, method: str, run_id: str, order: Sequence[int],
                 hosts: Callable[[bool], Awaitable[list[HostEntry]]], pool: HopPool, budget_s: float,
                 max_attempts: int = 5, avoid_s: float = 60.0,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.method = method
        self.run_id = run_id
        self.order = tuple(order)
        self.retries = 0
        self.failures: dict[str, str] = {}
        self.last_route: tuple[Hop, ...] = ()
        self.unreachable: dict[str, str] = {}
        self._told: set[str] = set()
        self._hosts = hosts
        self._pool = pool
        self._budget_s = budget_s
        self._max_attempts = max_attempts
        self._avoid_s = avoid_s
        self._now = now
        self._failed_at: dict[str, float] = {}

    async def run(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The last hop's answer, retrying around failed hops; RouteFailed when none is left."""
        request_id = secrets.token_hex(8)
        for attempt in range(self._max_attempts):  # after a failure the DHT is read again
            route = await self._route(refresh=attempt > 0, deadline=self._now() + self._budget_s)
            self.last_route = route
            frame = await self._pool.call(self.method, run_id=self.run_id, request_id=request_id, route=route,
                                          tensors=tensors, budget_s=self._budget_s)
            try:
                answer = parse_answer(frame)
            except DecodeError as exc:
                answer = FailedHop(addr=route[0].addr, reason=f"bad answer: {exc}")
            if isinstance(answer, dict):
                return answer
            self.failures[answer.addr] = answer.reason
            self._failed_at[answer.addr] = self._now()
            self.retries += 1
        raise RouteFailed(f"route request failed {self._max_attempts} times; failed hosts: {self._failed()}")

    async def _route(self, *, refresh: bool, deadline: float) -> tuple[Hop, ...]:
        """A route around the hosts that failed lately. When the table has nobody for some unit it is
        read again, with a growing pause, until ``deadline``: one DHT read can come back incomplete
        (it does while a node of the swarm is stalled), and a host that just started appears late."""
        avoid = {addr for addr, at in self._failed_at.items() if self._now() - at < self._avoid_s}
        pause_s = REREAD_PAUSE_S
        while True:
            hosts = await self._hosts(refresh)
            self._note_unreachable(hosts)
            try:
                return route_through(self.order, hosts, exclude=avoid)
            except RouteFailed as exc:
                if self._now() + pause_s > deadline:
                    raise type(exc)(f"{exc}; failed hosts: {self._failed()}") from None
            await asyncio.sleep(pause_s)
            refresh, pause_s = True, min(2 * pause_s, 1.0)

    def _note_unreachable(self, hosts: Sequence[HostEntry]) -> None:
        """The private hosts this route leaves out now (each logged the first time only)."""
        self.unreachable = {host.peer_id: host.addr for host in hosts if not host.reachable}
        for peer_id, addr in self.unreachable.items():
            if peer_id not in self._told:
                self._told.add(peer_id)
                log.info("not routing through %s (%s): it is private and no relay reaches it", peer_id[:12], addr)

    def _failed(self) -> str:
        return "; ".join(f"{addr}: {reason}" for addr, reason in self.failures.items()) or "none"

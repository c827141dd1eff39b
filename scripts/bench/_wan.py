"""The WAN link the benchmark's WAN rows run through: a ``WanProxy`` in the receiver's process."""

from __future__ import annotations

from typing import Any

from gossamer_harness.wan import LinkProfile, WanProxy

WAN_MBIT_PER_S = 100.0
WAN_LATENCY_MS = 50.0


def link_rate_bytes_per_s() -> float:
    """The emulated link's rate, in bytes per second."""
    return WAN_MBIT_PER_S * 1e6 / 8


async def maybe_proxy(address: tuple[str, int], params: dict[str, Any]) -> WanProxy | None:
    """A proxy to ``address`` shaped like the WAN link when ``params["wan"]``, else None."""
    if not params.get("wan"):
        return None
    profile = LinkProfile.from_mbit(WAN_MBIT_PER_S, WAN_LATENCY_MS)
    return await WanProxy.create(address[0], address[1], up=profile)

"""Finding a BlockTrain run's block coordinator and downloading a block version from it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from gossamer.peer.role import RoleContext
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.blocktrain import names
from gossamer.protocols.blocktrain.stack import unpack
from gossamer.transport.errors import DecodeError
from gossamer.transport.http_client import HttpClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockVersion:
    """Version ``version`` of block ``block``: its tensors and the shared E served with it."""

    block: int
    version: int
    tensors: dict[str, torch.Tensor]
    embedding: dict[str, torch.Tensor]


def live_coordinator(ctx: RoleContext) -> LivePeer | None:
    return next((p for p in ctx.view.live(now=ctx.now()) if names.COORDINATOR in p.record.roles), None)


async def find_coordinator(ctx: RoleContext, *, timeout_s: float) -> LivePeer | None:
    """The live block coordinator of the run, waiting up to ``timeout_s`` for it to appear."""
    await ctx.until_view(lambda: live_coordinator(ctx) is not None, timeout_s=timeout_s)
    return live_coordinator(ctx)


async def fetch_block(client: HttpClient, coordinator: LivePeer, block: int) -> BlockVersion:
    """The coordinator's current version of ``block``; DecodeError if the answer is not that."""
    url = f"http://{coordinator.record.http_addr}/blocktrain/block/{block}"
    tensors, metadata = await client.get_tensors(url, require_finite=True)
    version = metadata.get("version", "")
    if metadata.get("block") != str(block) or not version.isdigit():
        raise DecodeError(f"{url} answered block {metadata.get('block')!r} version {version!r}")
    try:
        block_tensors, embedding = unpack(tensors)
    except ValueError as exc:
        raise DecodeError(f"{url}: {exc}") from exc
    return BlockVersion(block=block, version=int(version), tensors=block_tensors, embedding=embedding)

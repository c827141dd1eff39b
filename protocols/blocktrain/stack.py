"""A BlockTrain stack holding only some of its blocks (the others on the meta device, no storage), and
the names a block travels under over HTTP and on disk: ``block.<name>``, and E as ``embed.<name>``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from gossamer.protocols.blocktrain.core import BlockStack, BlockTrainConfig

BLOCK_PREFIX = "block."
EMBED_PREFIX = "embed."


def partial_stack(config: BlockTrainConfig, blocks: Iterable[int], *, device: torch.device) -> BlockStack:
    """A stack whose E and ``blocks`` have (zeroed) storage on ``device``; every other block stays on meta."""
    with torch.device("meta"):
        stack = BlockStack(config)
    stack.embed.to_empty(device=device)
    for k in blocks:
        hold_block(stack, k, device=device)
    with torch.no_grad():
        stack.embed.weight.zero_()
    stack.embed.weight.requires_grad_(config.embedding == "averaged")
    return stack


def hold_block(stack: BlockStack, k: int, *, device: torch.device) -> None:
    """Give block k (zeroed) storage on ``device``; its contents are loaded afterwards."""
    block = stack.blocks[k]
    block.to_empty(device=device)
    with torch.no_grad():
        for param in block.parameters():
            param.zero_()


def release_block(stack: BlockStack, k: int) -> None:
    """Free block k's storage (back to the meta device)."""
    stack.blocks[k].to(torch.device("meta"))


def pack(block: Mapping[str, torch.Tensor], embedding: Mapping[str, torch.Tensor] | None = None
         ) -> dict[str, torch.Tensor]:
    """One object of block tensors (``block.<name>``) and, if given, E (``embed.<name>``)."""
    packed = {BLOCK_PREFIX + name: tensor for name, tensor in block.items()}
    packed.update({EMBED_PREFIX + name: tensor for name, tensor in (embedding or {}).items()})
    return packed


def unpack(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(block tensors, E tensors) by their names in the stack; ValueError for a name with neither prefix."""
    block, embedding = {}, {}
    for name, tensor in tensors.items():
        if name.startswith(BLOCK_PREFIX):
            block[name[len(BLOCK_PREFIX):]] = tensor
        elif name.startswith(EMBED_PREFIX):
            embedding[name[len(EMBED_PREFIX):]] = tensor
        else:
            raise ValueError(f"tensor {name[:80]!r} is neither {BLOCK_PREFIX}* nor {EMBED_PREFIX}*")
    return block, embedding

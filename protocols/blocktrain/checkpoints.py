"""The block coordinator's checkpoints: ``block<k>.safetensors`` per block and ``embedding.safetensors``
for E, each with its version, replaced atomically (a crash leaves the previous version, never a
torn one); ``read`` gives back an earlier life's files, or None when some block has none."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gossamer.peer.kit.checkpoint import Checkpoints

FORMAT = "gossamer/blocktrain"


@dataclass(frozen=True)
class Version:
    """One version of a block (or of E): its number and its tensors."""

    version: int
    tensors: dict[str, torch.Tensor]


class BlockCheckpoints:
    """Reads and writes one run's block and embedding files under ``directory``."""

    def __init__(self, directory: Path, run_id: str) -> None:
        self.files = Checkpoints(directory, run_id=run_id, format=FORMAT)

    def block_path(self, k: int) -> Path:
        return self.files.path(f"block{k}")

    @property
    def embedding_path(self) -> Path:
        return self.files.path("embedding")

    def write_block(self, k: int, block: Version) -> None:
        self.files.write(f"block{k}", block.tensors, kind="block", version=str(block.version), block=str(k))

    def write_embedding(self, embedding: Version) -> None:
        self.files.write("embedding", embedding.tensors, kind="embedding", version=str(embedding.version))

    def read(self, num_blocks: int) -> tuple[list[Version], Version | None] | None:
        """(block versions, E or None if never written) from an earlier life, or None."""
        blocks = []
        for k in range(num_blocks):
            found = self._read(f"block{k}", kind="block")
            if found is None:
                return None
            blocks.append(found)
        return blocks, self._read("embedding", kind="embedding")

    def _read(self, name: str, *, kind: str) -> Version | None:
        found = self.files.read(name, kind=kind)
        if found is None:
            return None
        _tensors, metadata = found
        version = metadata.get("version", "")
        return Version(version=int(version), tensors=found[0]) if version.isdigit() else None

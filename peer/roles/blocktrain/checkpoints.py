"""The block coordinator's checkpoints: one safetensors file per block and one for E.

``<directory>/block<k>.safetensors`` holds version v of block k (tensors named as in the stack,
metadata run id, block, version); ``<directory>/embedding.safetensors`` holds E and its version
(E changes only when the run averages it). Every file is replaced atomically (temp file, fsync,
rename, fsync of the folder), so a crash leaves the previous version, never a torn one. ``read``
gives back what an earlier life of the coordinator wrote for this run, or None when some block
has no usable file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from gossamer.transport.errors import DecodeError
from gossamer.transport.safetensors_stream import load_file, save_file_atomic

log = logging.getLogger(__name__)
FORMAT = "gossamer/blocktrain"


@dataclass(frozen=True)
class Version:
    """One version of a block (or of E): its number and its tensors."""

    version: int
    tensors: dict[str, torch.Tensor]


class BlockCheckpoints:
    """Reads and writes one run's block and embedding files under ``directory``."""

    def __init__(self, directory: Path, run_id: str) -> None:
        self.directory = directory
        self.run_id = run_id

    def block_path(self, k: int) -> Path:
        return self.directory / f"block{k}.safetensors"

    @property
    def embedding_path(self) -> Path:
        return self.directory / "embedding.safetensors"

    def write_block(self, k: int, block: Version) -> None:
        self._write(self.block_path(k), block, kind="block", extra={"block": str(k)})

    def write_embedding(self, embedding: Version) -> None:
        self._write(self.embedding_path, embedding, kind="embedding", extra={})

    def _write(self, path: Path, version: Version, *, kind: str, extra: dict[str, str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        metadata = {"run_id": self.run_id, "format": f"{FORMAT}-{kind}", "version": str(version.version),
                    **extra}
        save_file_atomic(version.tensors, path, metadata)

    def read(self, num_blocks: int) -> tuple[list[Version], Version | None] | None:
        """(block versions, E or None if never written) from an earlier life, or None."""
        blocks = []
        for k in range(num_blocks):
            found = self._read(self.block_path(k), kind="block")
            if found is None:
                return None
            blocks.append(found)
        embedding = None
        if self.embedding_path.is_file():
            embedding = self._read(self.embedding_path, kind="embedding")
        return blocks, embedding

    def _read(self, path: Path, *, kind: str) -> Version | None:
        if not path.is_file():
            return None
        try:
            tensors, metadata = load_file(path, require_finite=True)
        except (OSError, DecodeError) as exc:
            log.warning("not resuming from %s: %s", path, exc)
            return None
        version = metadata.get("version", "")
        ours = metadata.get("run_id") == self.run_id and metadata.get("format") == f"{FORMAT}-{kind}"
        if not ours or not version.isdigit():
            log.warning("not resuming from %s: it is not a %s checkpoint of run %s", path, kind, self.run_id)
            return None
        return Version(version=int(version), tensors=tensors)

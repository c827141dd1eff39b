"""``Checkpoints``: one way every role writes and reads its checkpoints, safetensors files in one
directory, each replaced atomically (a crash leaves the previous file, never a torn one) and read
back only when its metadata names this run and format; stale temp files are removed on opening."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from gossamer.transport.errors import DecodeError
from gossamer.transport.safetensors_stream import load_file, save_file_atomic

log = logging.getLogger(__name__)


class Checkpoints:
    """The checkpoint files of one role of one run under ``directory`` (created on first write)."""

    def __init__(self, directory: Path, *, run_id: str, format: str) -> None:
        self.directory = Path(directory).expanduser()
        self.run_id = run_id
        self.format = format
        self._remove_torn_files()

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.safetensors"

    def write(self, name: str, tensors: Mapping[str, torch.Tensor], *, kind: str = "",
              **metadata: str) -> Path:
        """Replace ``<name>.safetensors`` atomically; returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(name)
        save_file_atomic(dict(tensors), path, {"run_id": self.run_id, "format": self._format(kind), **metadata})
        return path

    async def write_async(self, name: str, tensors: Mapping[str, torch.Tensor], *, kind: str = "",
                          **metadata: str) -> Path:
        """``write`` in a worker thread (the tensors should be CPU copies the role no longer mutates)."""
        return await asyncio.to_thread(self.write, name, tensors, kind=kind, **metadata)

    def read(self, name: str, *, kind: str = "") -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
        """(tensors, metadata) of ``<name>.safetensors`` if it is a finite checkpoint of this run and
        format; None (with a warning saying why, unless it does not exist) otherwise."""
        path = self.path(name)
        if not path.is_file():
            return None
        try:
            tensors, metadata = load_file(path, require_finite=True)
        except (OSError, DecodeError) as exc:
            log.warning("not resuming from %s: %s", path, exc)
            return None
        if metadata.get("run_id") != self.run_id or metadata.get("format") != self._format(kind):
            log.warning("not resuming from %s: it is not a %s checkpoint of run %s", path, self._format(kind),
                        self.run_id)
            return None
        return tensors, metadata

    def _format(self, kind: str) -> str:
        return f"{self.format}-{kind}" if kind else self.format

    def _remove_torn_files(self) -> None:
        """Temp files of writes a kill -9 interrupted (``.<name>.<random>.tmp``): never valid, remove them."""
        if not self.directory.is_dir():
            return
        for torn in self.directory.glob(".*.safetensors.*.tmp"):
            with contextlib.suppress(OSError):
                torn.unlink()
                log.info("removed %s, left by an interrupted checkpoint write", torn)

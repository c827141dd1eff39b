"""The ``downloading`` event a joining (or lagging) peer emits per verified shard of the state: its
fields (``DOWNLOADING``, ``downloading_fields``) and how a plugin shows it (``describe_download``,
``download_progress``). Apart from ``state_join`` so that ``gossamer --help`` never imports torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gossamer.peer.kit.statesync import DownloadProgress

DOWNLOADING = ("version", "shards_done", "shards", "done_bytes", "total_bytes")
DOWNLOADING_DOC = ("the state download of a joining (or lagging) peer: shards and tensor bytes verified so far, of "
                   "the state at this version (once when its index is verified, then after every shard)")


def downloading_fields(progress: DownloadProgress) -> dict[str, int]:
    """The ``downloading`` event's fields for ``progress``."""
    return {"version": progress.version, "shards_done": progress.shards_done, "shards": progress.shards,
            "done_bytes": progress.done_bytes, "total_bytes": progress.total_bytes}


def describe_download(e: Mapping[str, Any], *, unit: str) -> str:
    """``downloading the run's state at round 12: 1.2 of 3.6 MB verified`` (``unit``: the
    protocol's word for a state version)."""
    return (f"downloading the run's state at {unit} {e['version']}: {e['done_bytes'] / 1e6:.1f} of "
            f"{e['total_bytes'] / 1e6:.1f} MB verified")


def download_progress(e: Mapping[str, Any]) -> tuple[int, int] | None:
    """(shards verified, shards) of a ``downloading`` event: its bar."""
    return (e["shards_done"], e["shards"]) if e["shards"] else None

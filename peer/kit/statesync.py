"""State sync: a peer joining mid-run downloads the current state in shards from several donors at
once. The digest in the donors' signed records is the only thing trusted: the index must hash to
it and every tensor must match the index; a failed shard moves to the next donor
(README.md of peer, "kit.statesync")."""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gossamer.peer.errors import PeerError
from gossamer.transport.codec import DTYPES, dtype_name, tensor_bytes
from gossamer.transport.errors import TransportError
from gossamer.transport.http_client import HttpClient

INDEX_PATH = "/state/index"
SHARD_PATH = "/state/shard"
_ENTRY_KEYS = frozenset({"name", "dtype", "shape", "nbytes", "sha256"})
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

StateGetter = Callable[[], tuple[int, Mapping[str, torch.Tensor]]]


class StateSyncError(PeerError):
    """The index or a shard could not be fetched from any donor; ``failures`` lists every attempt."""

    def __init__(self, message: str, *, failures: Sequence[FetchFailure]) -> None:
        super().__init__(message)
        self.failures = tuple(failures)


class _Rejected(Exception):
    """A donor's answer arrived but does not match the digest or the index (joiner side only)."""


@dataclass(frozen=True)
class Donor:
    """A live peer to download state from: its peer id and ``host:port`` HTTP address."""

    peer_id: str
    http_addr: str


@dataclass(frozen=True)
class FetchFailure:
    """One failed attempt: the donor, the shard (``None`` for the index) and why it failed."""

    peer_id: str
    shard: int | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class DownloadProgress:
    """How far a ``fetch_state`` call is: shards and tensor bytes verified so far, of the state's."""

    version: int
    shards_done: int
    shards: int
    done_bytes: int
    total_bytes: int


@dataclass(frozen=True, kw_only=True)
class StateFetchReport:
    """What a ``fetch_state`` call did.

    Attributes:
        version: the state version downloaded.
        num_shards: how many shards the state was split into.
        index_from: peer id of the donor whose index matched the digest.
        shards_served: every donor's peer id -> the shards it served and that verified.
        failures: every failed attempt, in the order they happened.
        bytes_downloaded: tensor bytes received in decoded shard bodies, verified or not.
        sources: how many verified states were combined into the result (``kit.state_join``: 1
            when a majority of the donors advertised one digest).
    """

    version: int
    num_shards: int
    index_from: str
    shards_served: Mapping[str, tuple[int, ...]]
    failures: tuple[FetchFailure, ...]
    bytes_downloaded: int
    sources: int = 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def tensor_sha256(tensor: torch.Tensor) -> str:
    """Hex SHA-256 of a tensor's raw little-endian bytes (copied to the CPU first if needed)."""
    return hashlib.sha256(tensor_bytes(tensor)).hexdigest()


def state_index(version: int, tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The JSON-ready index of a state: its version and one entry per tensor, sorted by name."""
    if not _is_int(version) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")
    entries = []
    for name in sorted(tensors):
        tensor = tensors[name]
        entries.append({"name": name, "dtype": dtype_name(tensor.dtype, name), "shape": list(tensor.shape),
                        "nbytes": _nbytes(tensor), "sha256": tensor_sha256(tensor)})
    return {"version": version, "tensors": entries}


def index_digest(index: Mapping[str, Any]) -> str:
    """Hex SHA-256 of the index's canonical JSON (sorted keys, no spaces, ASCII)."""
    text = json.dumps(index, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def plan_shards(index: Mapping[str, Any], num_shards: int) -> list[list[str]]:
    """Split the index's tensor names into ``num_shards`` shards of balanced byte size.

    Greedy, largest tensor first (ties by name), each into the currently lightest shard (ties by
    lowest shard number); names within a shard are sorted. Pure and deterministic, so a donor and
    a joiner holding the same index compute the same plan.
    """
    if not _is_int(num_shards) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    loads = [(0, shard) for shard in range(num_shards)]
    for entry in sorted(index["tensors"], key=lambda e: (-e["nbytes"], e["name"])):
        load, shard = heapq.heappop(loads)
        shards[shard].append(entry["name"])
        heapq.heappush(loads, (load + entry["nbytes"], shard))
    return [sorted(names) for names in shards]


def start_offset(joiner_id: str, num_donors: int) -> int:
    """Which donor (by position) a joiner asks first: derived from a hash of its id."""
    if not _is_int(num_donors) or num_donors < 1:
        raise ValueError(f"num_donors must be a positive int, got {num_donors!r}")
    digest = hashlib.sha256(joiner_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % num_donors


def _check_entry(entry: object, position: int) -> dict[str, Any]:
    where = f"index entry {position}"
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise _Rejected(f"{where} must be an object with exactly the keys {sorted(_ENTRY_KEYS)}")
    name, dtype, shape, nbytes = entry["name"], entry["dtype"], entry["shape"], entry["nbytes"]
    if not isinstance(name, str) or dtype not in DTYPES:
        raise _Rejected(f"{where} has a bad name or dtype")
    if not isinstance(shape, list) or not all(_is_int(dim) and dim >= 0 for dim in shape):
        raise _Rejected(f"{where} ({name!r}) has a bad shape")
    if not _is_int(nbytes) or nbytes != math.prod(shape) * DTYPES[dtype].itemsize:
        raise _Rejected(f"{where} ({name!r}) has an nbytes that does not match its shape and dtype")
    if not isinstance(entry["sha256"], str) or not _SHA256_HEX.fullmatch(entry["sha256"]):
        raise _Rejected(f"{where} ({name!r}) has a bad sha256")
    return entry


def _parse_index(answer: object, *, version: int, digest: str) -> dict[str, Any]:
    """The index from a donor's ``/state/index`` answer, checked against the trusted digest."""
    index = answer.get("index") if isinstance(answer, dict) else None
    if not isinstance(index, dict):
        raise _Rejected("the answer has no 'index' object")
    try:
        actual = index_digest(index)
    except ValueError as exc:  # NaN or Infinity somewhere in the JSON
        raise _Rejected(f"index is not canonical JSON: {exc}") from exc
    if actual != digest:
        raise _Rejected(f"index digest {actual[:16]}... does not match the published {digest[:16]}...")
    if set(index) != {"version", "tensors"} or index["version"] != version:
        raise _Rejected(f"index is not a version {version} index")
    if not isinstance(index["tensors"], list):
        raise _Rejected("index field 'tensors' is not a list")
    entries = [_check_entry(entry, position) for position, entry in enumerate(index["tensors"])]
    if len({entry["name"] for entry in entries}) != len(entries):
        raise _Rejected("index lists a tensor name twice")
    return index


def _verify_shard(tensors: Mapping[str, torch.Tensor], entries: Sequence[Mapping[str, Any]]) -> None:
    """Check a received shard against its index entries; runs in a worker thread."""
    expected = {entry["name"] for entry in entries}
    if set(tensors) != expected:
        raise _Rejected(f"shard holds tensors {sorted(tensors)}, expected {sorted(expected)}")
    for entry in entries:
        name, tensor = entry["name"], tensors[entry["name"]]
        if dtype_name(tensor.dtype, name) != entry["dtype"] or list(tensor.shape) != entry["shape"]:
            raise _Rejected(f"tensor {name!r} is {tensor.dtype} {list(tensor.shape)}, "
                            f"the index says {entry['dtype']} {entry['shape']}")
        if tensor_sha256(tensor) != entry["sha256"]:
            raise _Rejected(f"tensor {name!r}: sha256 does not match the index")


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout_s} s"
    return str(exc) if isinstance(exc, _Rejected) else f"{type(exc).__name__}: {exc}"


def _reasons(failures: Sequence[FetchFailure], shard: int | None) -> str:
    return "; ".join(f"{f.peer_id[:12]}: {f.reason}" for f in failures if f.shard == shard)


class _StateFetch:
    """One ``fetch_state`` call: who to ask next, and the ledger the report is built from."""

    def __init__(self, client: HttpClient, donors: Sequence[Donor], *, version: int, joiner_id: str,
                 timeout_s: float, progress: Callable[[DownloadProgress], None] | None) -> None:
        self.client, self.donors, self.version, self.timeout_s = client, tuple(donors), version, timeout_s
        self.progress = progress
        self.verified, self.total_bytes = (0, 0), 0  # (shards, tensor bytes) verified so far, of the state's bytes
        self.offset = start_offset(joiner_id, len(self.donors))
        self.num_shards = 0
        self.failures: list[FetchFailure] = []
        self.failed_donors: set[str] = set()
        self.served: dict[str, list[int]] = {donor.peer_id: [] for donor in self.donors}
        self.bytes_downloaded = 0

    def _next(self, first: int, tried: set[str]) -> Donor | None:
        """The next donor to try, from position ``first`` on: untried ones, those with no failure first."""
        rotation = [self.donors[(first + k) % len(self.donors)] for k in range(len(self.donors))]
        untried = [donor for donor in rotation if donor.peer_id not in tried]
        healthy = [donor for donor in untried if donor.peer_id not in self.failed_donors]
        return (healthy or untried or [None])[0]

    def _fail(self, donor: Donor, shard: int | None, exc: BaseException) -> None:
        self.failures.append(FetchFailure(donor.peer_id, shard, _describe(exc, self.timeout_s)))
        self.failed_donors.add(donor.peer_id)

    async def fetch_index(self, digest: str) -> tuple[dict[str, Any], str]:
        tried: set[str] = set()
        while (donor := self._next(self.offset, tried)) is not None:
            tried.add(donor.peer_id)
            try:
                async with asyncio.timeout(self.timeout_s):
                    answer = await self.client.get_json(f"http://{donor.http_addr}{INDEX_PATH}")
                index = await asyncio.to_thread(_parse_index, answer, version=self.version, digest=digest)
            except (TransportError, TimeoutError, _Rejected) as exc:
                self._fail(donor, None, exc)
                continue
            return index, donor.peer_id
        raise StateSyncError(f"no donor served a version {self.version} state index matching digest "
                             f"{digest[:16]}...: {_reasons(self.failures, None)}", failures=self.failures)

    async def fetch_shard(self, shard: int, entries: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor] | None:
        tried: set[str] = set()
        while (donor := self._next(shard + self.offset, tried)) is not None:
            tried.add(donor.peer_id)
            try:
                tensors = await self._try_shard(donor, shard, entries)
            except (TransportError, TimeoutError, _Rejected) as exc:
                self._fail(donor, shard, exc)
                continue
            self.served[donor.peer_id].append(shard)
            self._verified(sum(entry["nbytes"] for entry in entries), shards=1)
            return tensors
        return None

    async def _try_shard(self, donor: Donor, shard: int,
                         entries: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        url = (f"http://{donor.http_addr}{SHARD_PATH}"
               f"?version={self.version}&count={self.num_shards}&index={shard}")
        async with asyncio.timeout(self.timeout_s):
            tensors, _ = await self.client.get_tensors(url)
        self.bytes_downloaded += sum(_nbytes(tensor) for tensor in tensors.values())
        await asyncio.to_thread(_verify_shard, tensors, entries)
        return tensors

    async def run(self, digest: str) -> tuple[dict[str, torch.Tensor], StateFetchReport]:
        index, index_from = await self.fetch_index(digest)
        entries = {entry["name"]: entry for entry in index["tensors"]}
        self.num_shards = min(len(self.donors), len(entries))
        plan = plan_shards(index, self.num_shards) if self.num_shards else []
        self.total_bytes = sum(entry["nbytes"] for entry in entries.values())
        self._verified(0, shards=0)
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self.fetch_shard(shard, [entries[name] for name in names]))
                     for shard, names in enumerate(plan)]
        missing = [shard for shard, task in enumerate(tasks) if task.result() is None]
        if missing:
            details = " | ".join(f"shard {shard}: {_reasons(self.failures, shard)}" for shard in missing)
            raise StateSyncError(f"shard(s) {missing} of {self.num_shards} failed on every donor: {details}",
                                 failures=self.failures)
        received: dict[str, torch.Tensor] = {}
        for task in tasks:
            received.update(task.result() or {})
        return {name: received[name] for name in entries}, self._report(index_from)

    def _verified(self, nbytes: int, *, shards: int) -> None:
        self.verified = (self.verified[0] + shards, self.verified[1] + nbytes)
        if self.progress is not None:
            self.progress(DownloadProgress(version=self.version, shards_done=self.verified[0], shards=self.num_shards,
                                           done_bytes=self.verified[1], total_bytes=self.total_bytes))

    def _report(self, index_from: str) -> StateFetchReport:
        return StateFetchReport(version=self.version, num_shards=self.num_shards, index_from=index_from,
                                shards_served={peer: tuple(sorted(s)) for peer, s in self.served.items()},
                                failures=tuple(self.failures), bytes_downloaded=self.bytes_downloaded)


def _check_fetch_args(donors: Sequence[Donor], version: int, digest: str, timeout_s: float) -> None:
    if not donors or len({donor.peer_id for donor in donors}) != len(donors):
        raise ValueError("donors must be a non-empty sequence with distinct peer ids")
    if not _is_int(version) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")
    if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
        raise ValueError(f"digest must be 64 lowercase hex digits, got {digest!r}")
    if not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s!r}")


async def fetch_state(client: HttpClient, donors: Sequence[Donor], *, version: int, digest: str, joiner_id: str,
                      timeout_s: float = 60.0, progress: Callable[[DownloadProgress], None] | None = None,
                      ) -> tuple[dict[str, torch.Tensor], StateFetchReport]:
    """Download state ``version`` (whose index hashes to ``digest``) from ``donors``, one shard each.

    ``timeout_s`` bounds each request; ``progress`` hears how far it is (see the module docstring).
    Tensors come back on the CPU, sorted by name. Raises
    ``StateSyncError`` when no donor serves a matching index or some shard fails on every donor.
    """
    _check_fetch_args(donors, version, digest, timeout_s)
    fetch = _StateFetch(client, donors, version=version, joiner_id=joiner_id, timeout_s=timeout_s, progress=progress)
    return await fetch.run(digest)

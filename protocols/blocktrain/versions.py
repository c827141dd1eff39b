"""``BlockVersions``, the block coordinator's state (pure; ``now`` is a parameter): one versioned
checkpoint per block, the updates offered against it (accepted or refused with a reason), when a
version is due, and its close into the next one; the deadline adapts to the workers' update times
and a fail-slow worker is not waited for. The rules: ``protocols/blocktrain/README.md``."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from gossamer.protocols.blocktrain.core.versioning import mean_update, next_block, next_embedding
from gossamer.protocols.blocktrain.ledger import VersionLedger, version_history
from gossamer.protocols.core.pacing import AdaptiveDeadline, Pacing, SlowPeers

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Update:
    """One accepted update: who sent it, its differences, and the training loss it reported."""

    sender: str
    block: Tensors
    embedding: Tensors
    loss: float


class BlockVersions:
    """Versions, deadlines and pending updates of every block."""

    def __init__(self, blocks: list[Tensors], embedding: Tensors, *, deadline_s: float, max_norm: float,
                 embedding_averaged: bool, now: float, versions: list[int] | None = None,
                 embedding_version: int = 0, adaptive: bool = True) -> None:
        self.blocks = [dict(state) for state in blocks]
        self.embedding = dict(embedding)
        self.versions = list(versions) if versions is not None else [0] * len(blocks)
        self.deadline_s = deadline_s
        self.max_norm = max_norm
        self.embedding_averaged = embedding_averaged
        self.embedding_version = embedding_version
        self.ledgers = version_history()
        self.adaptive = adaptive
        self.pace = AdaptiveDeadline(deadline_s, Pacing())
        self.slow = SlowPeers()
        self.deadlines = [now + deadline_s] * len(blocks)
        self._pending: list[dict[str, Update]] = [{} for _ in blocks]
        for k, version in enumerate(self.versions):
            self.ledgers.add((k, version), VersionLedger(block=k, version=version, opened_at=now))

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def current(self, k: int) -> VersionLedger:
        ledger = self.ledgers.get((k, self.versions[k]))
        assert ledger is not None, (k, self.versions[k])
        return ledger

    def expect(self, k: int, workers: Collection[str]) -> None:
        """Workers assigned to block k while its current version is open (for the ledger)."""
        self.current(k).expect(list(workers))

    # -- receiving ----------------------------------------------------------------------------

    def offer(self, k: int, base_version: int, sender: str, tensors: Mapping[str, Tensors], *,
              loss: float, now: float) -> str | None:
        """Accept an update (``{"block": ..., "embedding": ...}`` differences) or return why not."""
        if not 0 <= k < self.num_blocks:
            return f"no block {k} (the run has {self.num_blocks})"
        reason = self._refusal(k, base_version, sender, tensors)
        ledger = self.ledgers.get((k, base_version)) if base_version <= self.versions[k] else self.current(k)
        if ledger is not None and (reason is None or base_version < self.versions[k]):
            self._time(sender, now - ledger.opened_at, accepted=reason is None)
        if reason is not None:
            if ledger is not None:
                ledger.reject(sender, reason)
            return reason
        self._pending[k][sender] = Update(sender=sender, block=dict(tensors["block"]),
                                          embedding=dict(tensors.get("embedding", {})), loss=loss)
        self.current(k).arrived = sorted(self._pending[k])
        return None

    def _time(self, sender: str, took_s: float, *, accepted: bool) -> None:
        """How long ``sender`` took from a version's opening to its update: for fail-slow detection
        always (a slow worker's updates arrive stale), for the deadline when it counts."""
        self.slow.observe(sender, took_s)
        if accepted and sender not in self.slow.flagged():
            self.pace.observe(took_s)

    def _refusal(self, k: int, base_version: int, sender: str, tensors: Mapping[str, Tensors]) -> str | None:
        current = self.versions[k]
        if base_version < current:
            return f"stale: trained from version {base_version} of block {k}, which is at version {current}"
        if base_version > current:
            return f"block {k} has no version {base_version} yet (current {current})"
        if sender in self._pending[k]:
            return f"duplicate update for version {current} of block {k}"
        problem = _mismatch("block", tensors.get("block", {}), self.blocks[k])
        if problem is None:
            wanted = self.embedding if self.embedding_averaged else {}
            problem = _mismatch("embedding", tensors.get("embedding", {}), wanted)
        if problem is not None:
            return problem
        squares = sum((t.double() ** 2).sum() for part in tensors.values() for t in part.values())
        norm = float(torch.sqrt(squares))
        if not norm <= self.max_norm:
            return f"update norm {norm:.3g} is over max_norm {self.max_norm:g}"
        return None

    # -- closing ------------------------------------------------------------------------------

    def due(self, k: int, assigned: Collection[str], *, now: float) -> bool:
        """True when version k should close now: something arrived and either the deadline passed
        or every assigned worker has been heard from."""
        pending = self._pending[k]
        if not pending:
            return False
        ledger = self.current(k)
        heard = set(pending) | set(ledger.rejected)
        waited_for = set(assigned) - self.slow.flagged() if self.adaptive else set(assigned)
        return now >= self.deadlines[k] or waited_for <= heard

    def overdue_and_empty(self, k: int, *, now: float) -> bool:
        return not self._pending[k] and now >= self.deadlines[k]

    def extend(self, k: int, *, now: float) -> None:
        """Nothing arrived by the deadline: keep the version open for another ``deadline_s``."""
        self.deadlines[k] = now + self.deadline_s
        self.current(k).deadline_extensions += 1

    def close(self, k: int, *, now: float) -> VersionLedger:
        """Average the accepted updates into the next version of block k; returns the closed ledger."""
        updates = [self._pending[k][sender] for sender in sorted(self._pending[k])]  # sender order
        assert updates, f"block {k}: close() with no updates"
        ledger = self.current(k)
        mean_block = mean_update([u.block for u in updates])
        self.blocks[k] = next_block(self.blocks[k], [u.block for u in updates])
        if self.embedding_averaged:
            self.embedding = next_embedding(self.embedding, [u.embedding for u in updates],
                                            num_blocks=self.num_blocks)
            self.embedding_version += 1
        ledger.train_loss = sum(u.loss for u in updates) / len(updates)
        ledger.update_norm = float(torch.sqrt(sum((t.double() ** 2).sum() for t in mean_block.values())))
        ledger.deadline_s = self.deadlines[k] - ledger.opened_at
        ledger.slow = sorted(self.slow.check())
        ledger.close(used=[u.sender for u in updates], now=now)
        self._pending[k] = {}
        self.versions[k] += 1
        self.deadlines[k] = now + self.next_wait_s()
        self.ledgers.add((k, self.versions[k]), VersionLedger(block=k, version=self.versions[k], opened_at=now))
        return ledger

    def next_wait_s(self) -> float:
        """How long the next version waits for its updates at most."""
        return self.pace.deadline_s() if self.adaptive else self.deadline_s

    def pacing_status(self) -> dict[str, object]:
        """For ``/status``: the wait a new version gets, and each worker's time over the others'."""
        return {"next_wait_s": round(self.next_wait_s(), 3), "adaptive": self.adaptive,
                "slow_workers": sorted(self.slow.flagged()),
                "worker_time_ratio": {peer: round(r, 3) for peer, r in sorted(self.slow.ratios().items())}}

    def next_deadline(self) -> float:
        return min(self.deadlines)


def _mismatch(what: str, got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> str | None:
    if got.keys() != want.keys():
        missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
        return f"{what} tensors do not match: missing {missing[:4]}, unexpected {extra[:4]}"
    for name, tensor in got.items():
        if tensor.shape != want[name].shape or tensor.dtype != want[name].dtype:
            return (f"{what} tensor {name!r} is {tuple(tensor.shape)} {tensor.dtype}, expected "
                    f"{tuple(want[name].shape)} {want[name].dtype}")
        if not bool(torch.isfinite(tensor).all()):
            return f"{what} tensor {name!r} holds NaN or Inf"
    return None


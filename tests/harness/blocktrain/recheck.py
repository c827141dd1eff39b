"""Block versions checked against the protocol's result: ``VersionStates`` (a ``LocalNet`` watcher)
keeps every version each coordinator life served; ``recheck`` recomputes version v + 1 with
``next_block`` from version v and exactly the updates its ledger used, as the workers sent them;
``agreement_problems`` lists the copies of a version that differ, bit for bit (a version served and
resumed, a server's blocks and the coordinator's). Frozen-E runs only (an averaged E interleaves)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gossamer.protocols.blocktrain.coordinator import BlockCoordinatorRole
from gossamer.protocols.blocktrain.core.versioning import next_block
from gossamer.protocols.blocktrain.ledger import VersionLedger
from gossamer.protocols.blocktrain.server import BlockServerRole
from gossamer.protocols.blocktrain.stack import unpack

Tensors = dict[str, torch.Tensor]
Sent = Callable[[str, str, str], dict[str, torch.Tensor]]
"""The tensors ``sender`` sent ``recipient`` at ``path`` (net names); KeyError if none were taken."""


@dataclass(frozen=True)
class Served:
    """One copy of a block version: the coordinator life that had it, and how (``start``: its
    initial or resumed version; ``closed``: it closed the version before)."""

    life: str
    how: str
    block: Tensors


class VersionStates:
    """Every version each watched coordinator life served, by (block, version)."""

    def __init__(self) -> None:
        self.lives: dict[str, BlockCoordinatorRole] = {}
        self.copies: dict[tuple[int, int], list[Served]] = {}

    def watch(self, name: str, role: BlockCoordinatorRole) -> None:
        """A coordinator life (before it starts): its first versions are what it serves now."""
        if role.settings.model.embedding != "frozen":
            raise ValueError("recheck recomputes runs with a frozen embedding only")
        self.lives[name] = role
        for k, version in enumerate(role.published):
            self._keep(k, version.version, Served(name, "start", _copy(version.tensors)))

    def __call__(self, name: str, event: str, fields: Mapping[str, Any]) -> None:
        """At a watched life's ``version`` event (sent once the version is on disk and served): keep it."""
        role = self.lives.get(name)
        if role is not None and event == "blocktrain.version":
            k = int(fields["block"])
            served = role.published[k]
            self._keep(k, served.version, Served(name, "closed", _copy(served.tensors)))

    def _keep(self, k: int, version: int, copy: Served) -> None:
        self.copies.setdefault((k, version), []).append(copy)

    def closed_ledgers(self) -> Iterable[tuple[str, VersionLedger]]:
        """(life, ledger) of every version any life closed."""
        for life, role in self.lives.items():
            for ledger in role.board.ledgers:
                if ledger.closed:
                    yield life, ledger

    def made_by(self, k: int, version: int, life: str) -> Served | None:
        """Version ``version`` of block k as ``life`` served it after closing the one before, or as
        the life after it resumed it (``life`` died after writing it); None if neither."""
        lives = list(self.lives)
        after = lives[lives.index(life) + 1] if lives.index(life) + 1 < len(lives) else None
        for copy in self.copies.get((k, version), []):
            if (copy.life, copy.how) in ((life, "closed"), (after, "start")):
                return copy
        return None


def recheck(states: VersionStates, life: str, ledger: VersionLedger, *, sent: Sent,
            names: Mapping[str, str], perturb: float = 0.0) -> float | None:
    """Max abs difference between version v + 1 of the ledger's block and the protocol's result
    over the updates it used (``names``: peer id -> net name; ``perturb`` is added to the
    recomputation, to show a check built on this can fail); None when v + 1 never reached the disk."""
    k, v = ledger.block, ledger.version
    made = states.made_by(k, v + 1, life)
    if made is None:
        return None
    base = states.copies.get((k, v))
    if not base:
        raise KeyError(f"no life served version {v} of block {k}")
    updates = [unpack(sent(names[sender], life, f"/blocktrain/update/{k}/{v}"))[0] for sender in ledger.used]
    if not updates:
        raise ValueError(f"{life} closed version {v} of block {k} with no update used")
    expected = next_block(base[0].block, updates)
    return max(float((expected[n] + perturb - made.block[n]).abs().max()) for n in expected)


def agreement_problems(states: VersionStates, servers: Mapping[str, BlockServerRole]) -> list[str]:
    """Where copies that must be bit-identical are not: every copy of one version (served by a life,
    resumed by the next), and each block a live server holds against the coordinator's version of
    it; empty if none."""
    problems = []
    for (k, v), copies in sorted(states.copies.items()):
        if not all(_equal(copies[0].block, c.block) for c in copies[1:]):
            problems.append(f"the copies of version {v} of block {k} differ: {[(c.life, c.how) for c in copies]}")
    for name, server in servers.items():
        if server.host is None:
            problems.append(f"{name} never loaded its blocks")
            continue
        for k, v in server.versions.items():
            held = {n: t.detach().cpu() for n, t in server.host.stack.block_state(k).items()}
            copies = states.copies.get((k, v))
            if not copies:
                problems.append(f"{name} holds version {v} of block {k}, which no coordinator served")
            elif not _equal(copies[0].block, held):
                problems.append(f"{name}'s copy of version {v} of block {k} differs from the coordinator's")
    return problems


def _equal(a: Tensors, b: Tensors) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def _copy(tensors: Mapping[str, torch.Tensor]) -> Tensors:
    return {name: t.detach().to("cpu").clone() for name, t in tensors.items()}

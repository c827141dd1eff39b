"""The in-process TL++ network the role tests use: ``peer.testing.localnet`` with the real
orchestrator (``tlpp-orchestrator``, not started: tests drive its steps), data nodes ``node0..`` and,
in secure mode, a helper (pinned in the manifest and by every node; the run admits only the
listed keys), each behind its own servers on 127.0.0.1; and ``digits_28``, the .npz
files of 28x28 images the declared-model tests give their nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gossamer.crypto.identity import Identity
from gossamer.protocols.registry import PLUGINS
from gossamer.protocols.tlpp.core import VirtualBatchScheduler
from gossamer.protocols.tlpp.data import load_data
from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.orchestrator import TlppOrchestratorRole
from gossamer_harness.localnet import LocalNet


class Tlpp(LocalNet):
    """A LocalNet of one TL++ run; ``await Tlpp.create(...)``, then ``await net.aclose()``."""

    @classmethod
    async def create(cls, tmp_path: Path, *, hyper: dict[str, Any], sources: list[str], helper: bool,  # type: ignore[override]
                     identities: dict[str, Identity] | None = None, model: dict[str, Any] | None = None,
                     data: dict[str, Any] | None = None, admit: tuple[Identity, ...] = ()) -> Tlpp:
        """Nodes ``node0..`` reading ``sources``, a helper if asked, and the orchestrator (not started),
        for a run with these ``hyper`` (and ``model``, ``data``) tables. Pass the same ``identities``
        to two networks to give them the same schedule; ``admit`` adds keys to a secure run's allowlist."""
        names = [f"node{i}" for i in range(len(sources))] + (["helper"] if helper else [])
        identities = identities or {name: Identity.generate() for name in [*names, "orchestrator"]}
        doc = {"run": {"name": "t", "protocol": "tlpp", "heartbeat_s": 30.0}, "hyper": hyper,
               **({"model": model} if model else {}), **({"data": data} if data else {})}
        pin: dict[str, Any] = {}
        if hyper.get("mode") == "secure":  # the helper pinned in the manifest and by every node; an allowlist
            pin = {"node": {"helper": identities["helper"].peer_id}}
            doc["hyper"] = {"helper": identities["helper"].peer_id, **hyper}
            allow = [identities[n].public_key for n in names] + [i.public_key for i in admit]
            doc["admission"] = {"policy": "allowlist", "allow": [key.hex() for key in allow]}
        net = await super().create(doc, plugins=PLUGINS, workdir=tmp_path, owner=identities["orchestrator"])
        net.identities = identities
        for i, source in enumerate(sources):
            await net.add(f"node{i}", ("node",), identity=identities[f"node{i}"], data=source, role_options=pin)
        if helper:
            await net.add("helper", ("helper",), identity=identities["helper"])
        await net.add("orchestrator", ("orchestrator", "tlpp-orchestrator"), identity=identities["orchestrator"])
        return net

    @property
    def orchestrator(self) -> TlppOrchestratorRole:
        return self.peers["orchestrator"].role_named("tlpp-orchestrator")  # type: ignore[return-value]

    def id_of(self, name: str) -> str:
        return self.peers[name].peer_id


async def drive(net: Tlpp, plan: list[tuple[int, set[str]]], *, lr: float) -> list[StepLedger]:
    """Virtual batches of epoch 0 (``plan``: per step, the batch index and the names of the nodes
    expected to count; a node is out of the schedule from the step after its first absence)
    through the orchestrator's own ``StepDriver`` (live nodes and helper), each step's summed
    gradient applied with plain SGD: what secure mode must get right is the gradient (the run's
    own optimizer, Adam in secure mode, is the orchestrator's business)."""
    role = net.orchestrator
    names = {net.id_of(name): name for name in net.peers if name.startswith("node")}
    scheduler = VirtualBatchScheduler(role._node_counts(), batch_size=net.settings.batch_size, seed=0)
    helper = net.id_of("helper") if net.settings.secure else None
    ledgers = []
    for step, (index, kept) in enumerate(plan):
        ledger = StepLedger(step=step, epoch=0, index=index, mode=net.settings.mode)
        grads = await role.driver.run(scheduler.epoch(0)[index], ledger, helper)
        assert grads is not None and {names[n] for n in ledger.used} == kept, (ledger.note, ledger.rejected)
        with torch.no_grad():
            for name, param in role.model.named_parameters():
                param -= lr * grads[name].to(param.dtype)
        role.driver.version += 1
        ledgers.append(ledger)
        gone = [n for n in scheduler.counts if names[n] not in kept]
        if gone:
            scheduler = scheduler.without(gone)
    return ledgers


def digits_28(folder: Path, owners: int = 4) -> list[str]:
    """sklearn's digits upsampled to 28x28 (raw 0..16 pixels: a run normalises them), written as the
    .npz files ``owners`` data owners would bring, every ``owners``-th sample each; returns the paths."""
    digits = load_data("builtin:digits", input_shape=(1, 8, 8), num_classes=10)
    images = F.interpolate(digits.x * 16, size=(28, 28), mode="bilinear", align_corners=False)
    paths = []
    for k in range(owners):
        paths.append(str(folder / f"owner{k}.npz"))
        np.savez(paths[-1], x=images[k::owners, 0].numpy(), y=digits.y[k::owners].numpy())
    return paths

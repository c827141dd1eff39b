"""The in-process TL++ network the role tests use: ``peer.testing.localnet`` with the real
orchestrator (``tlpp-server``, not started: tests drive its steps), data nodes ``node0..`` and,
in secure mode, a helper, each behind its own servers on 127.0.0.1; and ``digits_28``, the .npz
files of 28x28 images the declared-model tests give their nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch.nn.functional as F

from gossamer.crypto.identity import Identity
from gossamer.peer.roles import PLUGINS
from gossamer.peer.roles.tlpp.data import load_data
from gossamer.peer.roles.tlpp.server import TlppServerRole
from gossamer.peer.testing.localnet import LocalNet


class Tlpp(LocalNet):
    """A LocalNet of one TL++ run; ``await Tlpp.create(...)``, then ``await net.aclose()``."""

    @classmethod
    async def create(cls, tmp_path: Path, *, hyper: dict[str, Any], sources: list[str], helper: bool,  # type: ignore[override]
                     identities: dict[str, Identity] | None = None, model: dict[str, Any] | None = None,
                     data: dict[str, Any] | None = None) -> Tlpp:
        """Nodes ``node0..`` reading ``sources``, a helper if asked, and the orchestrator (not started),
        for a run with these ``hyper`` (and ``model``, ``data``) tables. Pass the same ``identities``
        to two networks to give them the same schedule."""
        names = [f"node{i}" for i in range(len(sources))] + (["helper"] if helper else [])
        identities = identities or {name: Identity.generate() for name in [*names, "orchestrator"]}
        doc = {"run": {"name": "t", "protocol": "tlpp", "heartbeat_s": 30.0}, "hyper": hyper,
               **({"model": model} if model else {}), **({"data": data} if data else {})}
        net = await super().create(doc, plugins=PLUGINS, workdir=tmp_path, owner=identities["orchestrator"])
        net.identities = identities
        for i, source in enumerate(sources):
            await net.add(f"node{i}", ("node",), identity=identities[f"node{i}"], data=source)
        if helper:
            await net.add("helper", ("helper",), identity=identities["helper"])
        await net.add("orchestrator", ("orchestrator", "tlpp-server"), identity=identities["orchestrator"])
        return net

    @property
    def orchestrator(self) -> TlppServerRole:
        return self.peers["orchestrator"].role_named("tlpp-server")  # type: ignore[return-value]

    def id_of(self, name: str) -> str:
        return self.peers[name].peer_id


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

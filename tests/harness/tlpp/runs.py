"""The secure-mode set-up of a TL++ run started as local processes (end-to-end tests, benchmarks,
soaks): the helper's and the data nodes' identities made before the run, the run config's helper
pin and allowlist, and the ``gossamer node`` command that pins the same helper."""

from __future__ import annotations

import json
from pathlib import Path

from gossamer.crypto.identity import Identity

BASE_NODE_COMMAND = ["peer", "--roles", "node"]


def secure_tables(work: Path, nodes: list[str]) -> tuple[str, list[str]]:
    """Creates ``work/helper.pem`` and ``work/<node>.pem``; returns the TOML to append to the run
    config (``helper`` under ``[hyper]``, then ``[admission]``) and the node command."""
    helper = Identity.create(work / "helper.pem")
    keys = [helper.public_key.hex(), *(Identity.create(work / f"{name}.pem").public_key.hex() for name in nodes)]
    return (f'helper = "{helper.peer_id}"\n[admission]\npolicy = "allowlist"\nallow = {json.dumps(keys)}\n',
            ["node", "--helper", helper.peer_id])

"""gossamer: a decentralized, peer-to-peer training network. This folder is installed as the one
top-level package ``gossamer``; the four layers are installed beneath it (``pyproject.toml``).
The public API is ``PUBLIC_API`` (documented in docs/ARCHITECTURE.md), imported on first use so
``import gossamer`` stays cheap (no torch, no hivemind)."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

PUBLIC_API: dict[str, str] = {
    # running peers
    "main": "gossamer.peer.cli.main",
    "Daemon": "gossamer.peer.daemon",
    "PeerConfig": "gossamer.peer.config",
    "build_peer_config": "gossamer.peer.config",
    # runs and their protocols
    "RunConfig": "gossamer.peer.run.manifest",
    "load_run_config": "gossamer.peer.run.manifest",
    "PLUGINS": "gossamer.protocols.registry",
    "ProtocolPlugin": "gossamer.peer.plugin",
    "PluginRegistry": "gossamer.peer.plugin",
    # protocol configs and the aggregators
    "ModelConfig": "gossamer.protocols.core.models",
    "DilocoConfig": "gossamer.protocols.diloco.core.replica",
    "MixingPlan": "gossamer.protocols.diloco.core.mixing",
    "BlockTrainConfig": "gossamer.protocols.blocktrain.core",
    "AGGREGATORS": "gossamer.protocols.core.robust",
}

__all__ = ["PUBLIC_API", "__version__", *PUBLIC_API]


def __getattr__(name: str) -> Any:
    module = PUBLIC_API.get(name)
    if module is None:
        raise AttributeError(f"module 'gossamer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

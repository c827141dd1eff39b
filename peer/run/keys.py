"""The DHT keys of a run (hivemind stores them under gossamer's ``gossamer/`` prefix).

``run/<run id>/manifest`` holds the owner-signed manifest under the owner's peer id as subkey;
``run/<run id>/peers`` holds one signed record per peer, under its peer id as subkey.
"""

from __future__ import annotations


def manifest_key(run_id: str) -> str:
    return f"run/{run_id}/manifest"


def peers_key(run_id: str) -> str:
    return f"run/{run_id}/peers"

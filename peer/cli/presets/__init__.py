"""Built-in run configs for ``gossamer swarm --preset NAME`` (package data: one TOML file per preset)."""

from __future__ import annotations

from importlib import resources


def presets() -> list[str]:
    """The names of the built-in presets."""
    folder = resources.files(__name__)
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))

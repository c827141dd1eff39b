"""Imports point downward only: scripts -> peer -> {protocols, transport, crypto}; transport -> crypto.

Walks every module's imports (statically, with ast) and fails when an arrow points the wrong way,
when code imports one of the layers by its bare folder name instead of ``gossamer.<layer>``, and
checks that only ``crypto`` imports ``cryptography``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("peer", "protocols", "transport", "crypto")
ALLOWED = {
    "protocols": {"protocols"},
    "crypto": {"crypto"},
    "transport": {"transport", "crypto"},
    "peer": {"peer", "protocols", "transport", "crypto"},
}


def imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of everything ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _package_of(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.add(node.module)
    return found


def _package_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] in LAYERS:
        return ".".join(("gossamer", *parts[:-1]))
    return ".".join(parts[:-1])


def layer_of(module: str) -> str | None:
    """``gossamer.peer.x`` -> ``peer``; None for what is not one of our layers."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gossamer" and len(parts) > 1 and parts[1] in LAYERS else None


def modules(*folders: str):
    for folder in folders:
        yield from sorted(p for p in (ROOT / folder).rglob("*.py") if "_gossamer" not in p.parts)


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", list(modules(*LAYERS)), ids=relative)
def test_imports_point_downward(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    imported = imported_modules(path)
    wrong = {m for m in imported if layer_of(m) and layer_of(m) not in ALLOWED[package]}
    assert not wrong, f"{relative(path)} imports {sorted(wrong)}; {package} may import only {sorted(ALLOWED[package])}"
    roots = {m.split(".")[0] for m in imported}
    if package != "crypto":
        assert "cryptography" not in roots, f"{relative(path)}: only crypto/ may import cryptography"
    if package == "protocols":
        io = roots & {"asyncio", "socket", "aiohttp", "hivemind", "time", "requests"}
        assert not io, f"{relative(path)}: protocols/ is sans-I/O but imports {sorted(io)}"


@pytest.mark.parametrize("path", list(modules(*LAYERS, "tests", "scripts")), ids=relative)
def test_layers_are_imported_through_the_gossamer_namespace(path: Path) -> None:
    bare = {m for m in imported_modules(path) if m.split(".")[0] in LAYERS}
    assert not bare, f"{relative(path)} imports {sorted(bare)}: write gossamer.<layer>... (what the wheel installs)"


def test_layering_walk_finds_modules() -> None:
    assert len(list(modules(*LAYERS))) >= 4

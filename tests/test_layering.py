"""Imports point downward only: scripts -> peer -> {protocols, transport, crypto}; transport -> crypto.

Walks every module's imports (statically, with ast) and fails when an arrow points the wrong way,
and checks that only ``crypto`` imports ``cryptography``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "protocols": {"protocols"},
    "crypto": {"crypto"},
    "transport": {"transport", "crypto"},
    "peer": {"peer", "protocols", "transport", "crypto"},
}
OURS = set(ALLOWED)


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def modules():
    for package in sorted(ALLOWED):
        yield from sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_downward(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    roots = imported_roots(path)
    wrong = (roots & OURS) - ALLOWED[package]
    assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}; {package} may import only {sorted(ALLOWED[package])}"
    if package != "crypto":
        assert "cryptography" not in roots, f"{path.relative_to(ROOT)}: only crypto/ may import cryptography"
    if package == "protocols":
        io = roots & {"asyncio", "socket", "aiohttp", "hivemind", "time", "requests"}
        assert not io, f"{path.relative_to(ROOT)}: protocols/ is sans-I/O but imports {sorted(io)}"


def test_layering_walk_finds_modules() -> None:
    assert len(list(modules())) >= 4

"""Imports point downward only: scripts -> peer -> {protocols, transport, crypto}; transport -> crypto.

Walks every module's imports (statically, with ast) and fails when an arrow points the wrong way,
when code imports one of the layers by its bare folder name instead of ``gossamer.<layer>``, and
checks that only ``crypto`` imports ``cryptography``.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
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


# -- inside peer/: rooms, and who may import whom ---------------------------------------------------

GENERIC_ROOMS = ("run", "kit", "route", "testing", "reach")


def peer_room(path: Path) -> tuple[str, ...]:
    """``peer/roles/diloco/learner.py`` -> ("roles", "diloco"); ``peer/daemon.py`` -> ()."""
    parts = path.relative_to(ROOT / "peer").parts[:-1]
    return tuple(parts[:2])


@pytest.mark.parametrize("path", list(modules("peer")), ids=relative)
def test_rooms_inside_peer_import_in_the_allowed_direction(path: Path) -> None:
    room = peer_room(path)
    imported = imported_modules(path)
    roles = {m for m in imported if m.startswith("gossamer.peer.roles")}
    if room[:1] and room[0] in GENERIC_ROOMS:
        assert not roles, f"{relative(path)}: peer/{room[0]} must not import the protocols' roles ({sorted(roles)})"
        cli = {m for m in imported if m.startswith("gossamer.peer.cli")}
        assert not cli, f"{relative(path)}: peer/{room[0]} must not import the CLI ({sorted(cli)})"
    if room[:1] == ("roles",) and len(room) == 2:
        others = {m for m in roles if m.split(".")[3:4] and m.split(".")[3] != room[1]}
        assert not others, f"{relative(path)}: roles/{room[1]} imports another protocol's room: {sorted(others)}"
        assert "gossamer.peer.roles" not in imported, f"{relative(path)} imports the registry from inside a protocol"
        assert not {m for m in imported if m.startswith("gossamer.peer.cli")}, \
            f"{relative(path)}: a protocol's commands get the CLI's kit as an argument; never import the CLI"
    if not room:  # the generic top of peer/: the registry, never a protocol's room
        named = {m for m in roles if m != "gossamer.peer.roles"}
        assert not named, f"{relative(path)} names a protocol's modules: {sorted(named)}"


def test_only_the_registry_module_lists_plugins() -> None:
    listing = [relative(p) for p in modules("peer") if "PluginRegistry(" in p.read_text(encoding="utf-8")]
    assert listing == ["peer/plugin.py", "peer/roles/__init__.py"], listing


@pytest.mark.parametrize("path", list(modules("scripts")), ids=relative)
def test_scripts_never_import_the_tests(path: Path) -> None:
    wrong = {m for m in imported_modules(path) if m.split(".")[0] == "tests"}
    assert not wrong, f"{relative(path)} imports {sorted(wrong)}: shipped test support lives in gossamer.peer.testing"


# -- maps and trees in the docstrings say what exists -----------------------------------------------

PACKAGES = sorted({p.parent for layer in LAYERS for p in (ROOT / layer).rglob("__init__.py")
                   if "_gossamer" not in p.parts and "presets" not in p.parts})


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_docstring_maps_its_modules(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    members = sorted({p.stem for p in package.glob("*.py") if p.stem != "__init__" and p.stem != "__main__"}
                     | {p.name for p in package.iterdir() if (p / "__init__.py").is_file() and p.name != "_gossamer"})
    missing = [name for name in members if f"``{name}``" not in doc]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py's docstring does not map {missing}"


ERROR_TREES = {"peer": "peer/errors.py", "protocols": "protocols/errors.py", "transport": "transport/__init__.py",
               "crypto": "crypto/__init__.py"}


BUILTIN_EXCEPTIONS = frozenset(name for name, obj in vars(builtins).items()
                               if isinstance(obj, type) and issubclass(obj, BaseException))


def module_name(path: Path) -> str:
    """``peer/kit/ledger.py`` -> ``gossamer.peer.kit.ledger``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("gossamer", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def defined_exceptions(layer: str) -> set[str]:
    """Every public exception class ``layer`` defines, whatever it derives from (one of ours, a
    builtin such as RuntimeError, a library's): at module level by importing the module and asking
    ``issubclass(cls, BaseException)``; inside a function body by its bases' names (a builtin
    exception or an exception of the layer). Private classes (``_Rejected``) never leave their module."""
    found: set[str] = set()
    nested: dict[str, set[str]] = {}
    for path in modules(layer):
        if path.name == "__main__.py":
            continue  # running it is what importing it does
        module = importlib.import_module(module_name(path))
        found |= {name for name, obj in vars(module).items() if isinstance(obj, type)
                  and obj.__module__ == module.__name__ and issubclass(obj, BaseException)}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name not in vars(module):
                nested[node.name] = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
    known = BUILTIN_EXCEPTIONS | found
    while grown := {name for name, bases in nested.items() if bases & known} - known:
        found |= grown
        known |= grown
    return {name for name in found if not name.startswith("_")}


def test_the_exception_walk_sees_exceptions_of_any_base() -> None:
    """``NetLabError(RuntimeError)`` once slipped past a walk that only followed Exception and
    ValueError."""
    assert "NetLabError" in defined_exceptions("peer")
    assert {"ProtocolError", "InvalidSetting"} <= defined_exceptions("protocols")


@pytest.mark.parametrize("layer", LAYERS)
def test_every_exception_is_in_its_layers_tree(layer: str) -> None:
    tree = ast.get_docstring(ast.parse((ROOT / ERROR_TREES[layer]).read_text(encoding="utf-8"))) or ""
    missing = sorted(name for name in defined_exceptions(layer) if not re.search(rf"\b{name}\b", tree))
    assert not missing, f"{ERROR_TREES[layer]}'s exception tree does not list {missing}"


MAX_LINES = 400  # STYLE.md: files of 100-300 lines, look again at 400; past it, split by concern


def test_no_module_is_longer_than_the_limit() -> None:
    lengths = {relative(path): len(path.read_text(encoding="utf-8").splitlines()) for path in modules(*LAYERS)}
    long = {path: lines for path, lines in lengths.items() if lines > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"

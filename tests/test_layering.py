"""The tree draws the architecture, and these tests hold it to it (docs/ARCHITECTURE.md, "Layers"):
the import arrows between ``crypto``, ``transport``, ``peer``, the registry, the protocols' roles
and their sans-I/O cores; nothing shipped imports the harness; every package docstring maps its
modules and every exception is in its layer's tree; a role is one class in one module (no mixin
halves), one-class modules up to 800 lines, others up to 400."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("peer", "protocols", "transport", "crypto")
PROTOCOLS = sorted(p.name for p in (ROOT / "protocols").iterdir() if (p / "__init__.py").is_file() and p.name != "core")
IO_MODULES = {"asyncio", "socket", "aiohttp", "hivemind", "time", "requests", "selectors", "subprocess", "threading"}


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


def place_of(module: str) -> tuple[str, ...]:
    """Where a dotted name lives: ("crypto",), ("transport",), ("peer",), ("peer", "cli"),
    ("core",) for protocols/core, (p, "core") for a protocol's core, (p,) for its roles,
    ("registry",), ("protocols",) for the package itself; () for what is not ours."""
    parts = module.split(".")
    if parts[0] != "gossamer" or len(parts) < 2 or parts[1] not in LAYERS:
        return ()
    if parts[1] != "protocols":
        return ("peer", "cli") if parts[1:3] == ["peer", "cli"] else (parts[1],)
    rest = parts[2:]
    if not rest:
        return ("protocols",)
    if rest[0] in ("core", "registry"):
        return (rest[0],)
    return (rest[0], "core") if rest[1:2] == ["core"] else (rest[0],)


def allowed(importer: tuple[str, ...], imported: tuple[str, ...], module: str) -> bool:
    """Whether a module at ``importer`` may import ``module`` (at ``imported``):

    - ``crypto`` imports nothing of gossamer's; ``transport`` imports ``crypto`` only.
    - ``peer`` imports ``protocols/core``, ``transport`` and ``crypto``, never a protocol's roles;
      only ``peer/cli`` reads the registry.
    - a core (``protocols/core``, ``protocols/<p>/core``) imports cores and ``crypto.sharing`` only.
    - a protocol's roles import ``peer``, cores, ``transport`` and ``crypto``, never another
      protocol's roles, the registry or the CLI.
    """
    if not imported or imported == importer or imported == ("protocols",):
        return True
    top = importer[0]
    if top == "crypto":
        return False
    if top == "transport":
        return imported == ("crypto",)
    if top == "peer":
        if imported == ("registry",):
            return importer == ("peer", "cli")
        return imported[0] in ("peer", "transport", "crypto", "core")
    if importer in (("core",),) or importer[1:] == ("core",):  # a core: other cores and crypto.sharing
        return imported == ("core",) or imported[1:] == ("core",) or module.startswith("gossamer.crypto.sharing")
    if importer == ("registry",):
        return (len(imported) == 1 and imported[0] in PROTOCOLS) or imported == ("peer",)
    # a protocol's roles
    if imported in (("registry",), ("peer", "cli")):
        return False
    return imported[0] in ("peer", "transport", "crypto", "core") or imported[1:] == ("core",)


def place_of_path(path: Path) -> tuple[str, ...]:
    return place_of(module_name(path))


@pytest.mark.parametrize("path", list(modules(*LAYERS)), ids=relative)
def test_imports_point_the_allowed_way(path: Path) -> None:
    here = place_of_path(path)
    imported = imported_modules(path)
    wrong = sorted(m for m in imported if not allowed(here, place_of(m), m))
    assert not wrong, f"{relative(path)} ({'/'.join(here)}) imports {wrong} (the rules: allowed())"
    roots = {m.split(".")[0] for m in imported}
    if here[0] != "crypto":
        assert "cryptography" not in roots, f"{relative(path)}: only crypto/ may import cryptography"
    assert not roots & {"gossamer_harness", "tests"}, f"{relative(path)}: shipped code imports the harness or tests"
    if here == ("core",) or here[1:] == ("core",):
        io = roots & IO_MODULES
        assert not io, f"{relative(path)}: a core is sans-I/O but imports {sorted(io)}"


def test_the_walk_tells_the_places_apart() -> None:
    assert place_of("gossamer.protocols.diloco.core.mixing") == ("diloco", "core")
    assert place_of("gossamer.protocols.diloco.learner") == ("diloco",)
    assert place_of("gossamer.protocols.core.robust.base") == ("core",)
    assert place_of("gossamer.peer.cli.main") == ("peer", "cli")
    assert not allowed(("peer",), ("diloco",), "gossamer.protocols.diloco.learner")
    assert not allowed(("tlpp",), ("diloco",), "gossamer.protocols.diloco.learner")
    assert allowed(("fomoe",), ("diloco", "core"), "gossamer.protocols.diloco.core.replica")
    assert not allowed(("diloco", "core"), ("peer",), "gossamer.peer.role")
    assert allowed(("tlpp", "core"), ("crypto",), "gossamer.crypto.sharing")
    assert not allowed(("tlpp", "core"), ("crypto",), "gossamer.crypto.identity")
    assert len(PROTOCOLS) >= 6


@pytest.mark.parametrize("path", list(modules(*LAYERS, "tests", "scripts")), ids=relative)
def test_layers_are_imported_through_the_gossamer_namespace(path: Path) -> None:
    bare = {m for m in imported_modules(path) if m.split(".")[0] in LAYERS}
    assert not bare, f"{relative(path)} imports {sorted(bare)}: write gossamer.<layer>... (what the wheel installs)"


def test_layering_walk_finds_modules() -> None:
    assert len(list(modules(*LAYERS))) >= 4


def test_only_the_registry_module_lists_plugins() -> None:
    listing = [relative(p) for p in modules(*LAYERS) if "PluginRegistry(" in p.read_text(encoding="utf-8")]
    assert listing == ["peer/plugin.py", "protocols/registry.py"], listing


@pytest.mark.parametrize("path", list(modules("scripts")), ids=relative)
def test_scripts_never_import_the_tests(path: Path) -> None:
    wrong = {m for m in imported_modules(path) if m.split(".")[0] == "tests"}
    assert not wrong, f"{relative(path)} imports {sorted(wrong)}: shipped test support lives in gossamer_harness"


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


ERROR_TREES = {"peer": "peer/errors.py", "protocols": "protocols/core/errors.py", "transport": "transport/__init__.py",
               "crypto": "crypto/__init__.py"}
"""Where each exception is drawn: the runtime's and the protocols' roles' in peer's tree (they are
PeerErrors), the cores' in protocols/core's."""


def is_core(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return parts[0] == "protocols" and (parts[1:2] == ("core",) or parts[2:3] == ("core",))


def tree_paths(tree: str) -> list[Path]:
    if tree == "peer":
        return [*modules("peer"), *(p for p in modules("protocols") if not is_core(p))]
    if tree == "protocols":
        return [p for p in modules("protocols") if is_core(p)]
    return list(modules(tree))


BUILTIN_EXCEPTIONS = frozenset(name for name, obj in vars(builtins).items()
                               if isinstance(obj, type) and issubclass(obj, BaseException))


def module_name(path: Path) -> str:
    """``peer/kit/ledger.py`` -> ``gossamer.peer.kit.ledger``; a package's ``__init__.py`` -> the package;
    ``tests/harness/netns.py`` -> ``gossamer_harness.netns``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    if parts[:2] == ("tests", "harness"):
        return ".".join(("gossamer_harness", *parts[2:]))
    return ".".join(("gossamer", *parts))


def defined_exceptions(paths: list[Path]) -> set[str]:
    """Every public exception class ``layer`` defines, whatever it derives from (one of ours, a
    builtin such as RuntimeError, a library's): at module level by importing the module and asking
    ``issubclass(cls, BaseException)``; inside a function body by its bases' names (a builtin
    exception or an exception of the layer). Private classes (``_Rejected``) never leave their module."""
    found: set[str] = set()
    nested: dict[str, set[str]] = {}
    for path in paths:
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
    assert "NetLabError" in defined_exceptions([ROOT / "tests" / "harness" / "netns.py"])
    assert {"ProtocolError", "InvalidSetting"} <= defined_exceptions(tree_paths("protocols"))


@pytest.mark.parametrize("layer", LAYERS)
def test_every_exception_is_in_its_layers_tree(layer: str) -> None:
    tree = ast.get_docstring(ast.parse((ROOT / ERROR_TREES[layer]).read_text(encoding="utf-8"))) or ""
    missing = sorted(name for name in defined_exceptions(tree_paths(layer)) if not re.search(rf"\b{name}\b", tree))
    assert not missing, f"{ERROR_TREES[layer]}'s exception tree does not list {missing}"


MAX_LINES = 400  # a module of several concerns
MAX_LINES_ONE_CLASS = 800  # a module that defines one class (a role, say) may run longer before it is split


def classes_in(path: Path) -> list[str]:
    return [n.name for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)]


def test_no_module_is_longer_than_its_limit() -> None:
    long = {}
    for path in modules(*LAYERS):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        limit = MAX_LINES_ONE_CLASS if len(classes_in(path)) == 1 else MAX_LINES
        if lines > limit:
            long[relative(path)] = (lines, limit)
    assert not long, f"modules over their limit (lines, limit); split them into real objects: {long}"


@pytest.mark.parametrize("path", list(modules(*LAYERS)), ids=relative)
def test_no_class_is_split_into_mixin_halves(path: Path) -> None:
    """A method whose ``self`` is annotated belongs to a half of a class defined elsewhere."""
    halves = [f"{node.name} (line {node.lineno})" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.args.args
              and node.args.args[0].arg == "self" and node.args.args[0].annotation is not None]
    assert not halves, f"{relative(path)}: methods of a mixin half (self annotated): {halves}"


def _base_name(base: ast.expr) -> str:
    base = base.value if isinstance(base, ast.Subscript) else base
    return base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")


TYPING_BASES = {"Generic", "Protocol"}  # a type parameter, not a half of the class


def mixin_roles(source: str) -> list[str]:
    """The role classes of ``source`` that inherit from more than one class besides typing's."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            bases = [_base_name(b) for b in node.bases if _base_name(b) not in TYPING_BASES]
            if len(bases) > 1 and any(b.endswith("Role") for b in bases):
                found.append(node.name)
    return found


def test_the_mixin_walk_tells_a_type_parameter_from_a_mixin() -> None:
    assert mixin_roles("class A(ProtocolRole, Stepping): pass\nclass B(Role, Generic[S]): pass\n") == ["A"]


@pytest.mark.parametrize("path", list(modules("protocols", "peer")), ids=relative)
def test_a_role_is_one_class_not_a_sum_of_mixins(path: Path) -> None:
    mixed = mixin_roles(path.read_text(encoding="utf-8"))
    assert not mixed, f"{relative(path)}: role classes built from mixins: {mixed}; make them one class or real objects"


DOCSTRING_LINES = 5  # a module says what it holds and its invariants; specs live in the READMEs


@pytest.mark.parametrize("path", [p for p in modules(*LAYERS) if p.name not in ("__init__.py", "errors.py")]
                         + sorted(p for p in (ROOT / "tests" / "harness").rglob("*.py") if p.name != "__init__.py"),
                         ids=relative)
def test_a_module_docstring_says_in_a_few_lines_what_the_module_holds(path: Path) -> None:
    """Package maps and exception trees (``__init__``, ``errors``) may run longer."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert 1 <= len(doc.splitlines()) <= DOCSTRING_LINES, \
        f"{relative(path)}: its docstring has {len(doc.splitlines())} lines; 1-{DOCSTRING_LINES}, the spec goes to a README"

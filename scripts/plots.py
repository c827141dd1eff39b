#!/usr/bin/env python3
"""Draw every figure under ``scripts/*/results/`` again from the JSON beside it, with the plot
function of the script that wrote it::

    .venv/bin/python scripts/plots.py [NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
PLOTS = (("bench", "wan_training", "_wan_training_report"),
         ("experiments", "context", "_context_report"),
         ("experiments", "diloco_variants", "_diloco_report"),
         ("experiments", "fomoe", "fomoe"))
"""(folder, result name or its prefix before "_", module of that folder whose ``plot(result, path)``
draws it)."""


@contextmanager
def folder_on_path(folder: Path) -> Iterator[None]:
    """Import a folder's modules as its scripts do (by bare name), then forget them: the folders
    have modules of the same name (``_common``)."""
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(folder)):
                del sys.modules[name]


def plot_of(png: Path) -> tuple[str, str]:
    """The (folder, module) whose plot draws ``png``."""
    folder = png.parent.parent.name
    for where, prefix, module in PLOTS:
        if where == folder and (png.stem == prefix or png.stem.startswith(prefix + "_")):
            return folder, module
    raise SystemExit(f"{png.relative_to(SCRIPTS.parent)}: no plot draws it; add its script's to PLOTS")


def figures(names: list[str]) -> list[Path]:
    pngs = sorted(SCRIPTS.glob("*/results/*.png"))
    chosen = [png for png in pngs if not names or png.stem in names]
    unknown = set(names) - {png.stem for png in chosen}
    if unknown:
        raise SystemExit(f"no figure named {sorted(unknown)} under scripts/*/results/")
    return chosen


def draw(png: Path, out: Path | None) -> Path:
    folder, module = plot_of(png)
    source = png.with_suffix(".json")
    if not source.is_file():
        raise SystemExit(f"{png.relative_to(SCRIPTS.parent)}: no {source.name} beside it")
    result: dict[str, Any] = json.loads(source.read_text(encoding="utf-8"))
    target = png if out is None else out / folder / png.name
    with folder_on_path(SCRIPTS / folder):
        plot: Callable[[dict[str, Any], Path], None] = importlib.import_module(module).plot
        plot(result, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="figures to draw, by file name without .png (default: all)")
    parser.add_argument("--out", type=Path, help="write them under OUT/<folder>/ instead of over the committed ones")
    args = parser.parse_args(argv)
    for png in figures(args.names):
        print(draw(png, args.out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

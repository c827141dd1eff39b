"""Result files of the scripts (benchmarks, chaos runs, experiments): JSON that says what it was
measured on (host, versions, git commit, load average before and after), Markdown tables, figures.
A figure is drawn from its result's JSON alone, so ``scripts/plots.py`` can draw it again."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

MB = 1_000_000
"""Bytes per MB in every figure (decimal, like link rates)."""

REPO = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S = 10.0


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages now."""
    return list(os.getloadavg())


def load_average_text() -> str:
    """The load averages now as "1.23 / 4.56 / 7.89" (beside a printed table)."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def git_commit() -> str | None:
    """This checkout's commit, with "-dirty" when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if changed else "")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(**extra: Any) -> dict[str, Any]:
    """What a result is measured on, now (call it before the run): host, versions, commit, load."""
    found = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
             "platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
             "python": platform.python_version(), "torch": _version("torch"), "hivemind": _version("hivemind"),
             "git_commit": git_commit(), "load_average": load_average()}
    if "torch" in sys.modules:  # the threads the script set, without importing torch for it
        found["torch_threads"] = sys.modules["torch"].get_num_threads()
    return {**found, **extra}


def args_of(args: argparse.Namespace) -> dict[str, str]:
    """A script's parsed arguments as JSON (every value as text)."""
    return {key: str(value) for key, value in vars(args).items()}


def write_json(path: Path, data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON to ``path``, creating its folder; what JSON has no type for is written
    as its ``str``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=str) + "\n", encoding="utf-8")
    return path


def write_result(path: Path, data: dict[str, Any], *, before: dict[str, Any] | None = None,
                 args: argparse.Namespace | None = None, markdown: str | None = None,
                 indent: int | None = 2) -> dict[str, Any]:
    """Write a result's JSON to ``path`` and return it: "machine" (``before``, from ``machine()`` at
    the start; now when None), "load_average_after", "args" when given, then ``data``; ``markdown``
    beside it as .md."""
    head: dict[str, Any] = {"machine": machine() if before is None else before, "load_average_after": load_average()}
    if args is not None:
        head["args"] = args_of(args)
    result = {**head, **data}
    write_json(path, result, indent=indent)
    if markdown is not None:
        path.with_suffix(".md").write_text(markdown + "\n", encoding="utf-8")
    return result


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table: the first column left-aligned, the others right-aligned (numbers);
    cells are printed with ``str`` (format floats before)."""
    align = [":---"] + ["---:"] * (len(header) - 1)
    lines = [list(header), align, *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in cells) + " |" for cells in lines)


@contextlib.contextmanager
def figure(path: Path, *, figsize: tuple[float, float], nrows: int = 1, ncols: int = 1, dpi: int = 110,
           squeeze: bool = True) -> Iterator[tuple[Any, Any]]:
    """A matplotlib figure and its axes (headless); on leaving, laid out tight and saved to
    ``path`` as PNG at ``dpi``. The figure is closed either way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=squeeze)
    try:
        yield fig, axes
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)

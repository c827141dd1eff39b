"""The committed tree holds no leftover merge-conflict markers (one once reached README.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
TEXT = (".py", ".md", ".toml", ".txt", ".cfg", ".sh", ".html", ".js", ".css", ".json")


def test_no_file_holds_a_merge_conflict_marker() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [ROOT / line for line in tracked.splitlines() if line.endswith(TEXT) or "/" not in line]
    marked = [str(path.relative_to(ROOT)) for path in paths
              if path.is_file() and MARKER.search(path.read_text(encoding="utf-8", errors="replace"))]

    assert not marked, f"merge-conflict markers in {marked}"

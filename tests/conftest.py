"""Suite-wide fixtures: count open sockets and tasks so leaks fail the test that caused them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("GOSSAMER_TEST", "1")

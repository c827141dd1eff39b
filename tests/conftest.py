"""Suite-wide fixtures: count open sockets and tasks so leaks fail the test that caused them."""

from __future__ import annotations

import os

os.environ.setdefault("GOSSAMER_TEST", "1")

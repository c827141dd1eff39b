"""Suite-wide settings: the test flag daemons read, and hypothesis without per-example deadlines."""

from __future__ import annotations

import os

os.environ.setdefault("GOSSAMER_TEST", "1")

from hypothesis import settings

# No timing assertions in unit tests: hypothesis's per-example deadline fails on a busy machine.
settings.register_profile("gossamer", deadline=None)
settings.load_profile("gossamer")

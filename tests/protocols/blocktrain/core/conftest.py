"""Every BlockTrain protocol test runs torch on one thread (``one_thread``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(one_thread: None) -> None:
    """Applies ``tests/protocols/conftest.py``'s ``one_thread`` to each test here."""

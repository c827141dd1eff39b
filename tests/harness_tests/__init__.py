"""Tests of the test and fault harness itself (tests/harness, the gossamer_harness package)."""

"""Context-parallel scenarios for the tests and ``scripts/chaos/context_*.py``: ``byzantine`` (a
cp-shard that sends a scaled gradient share, and a ring run on a LocalNet)."""

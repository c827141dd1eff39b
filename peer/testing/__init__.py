"""Shipped test support (tests and scripts use it; nothing in the daemon does).

- ``localproc``  ``gossamer`` processes started through the CLI, their events read from stdout.
- ``localnet``   an in-process network of any protocol's roles behind real servers.
"""

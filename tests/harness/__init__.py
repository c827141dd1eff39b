"""Test and fault harness, shared by tests and scripts; a dev-only package, never in the wheel.

- ``localproc``    ``gossamer`` processes started through the CLI, their events read from stdout.
- ``localnet``     an in-process network of any protocol's roles behind real servers.
- ``faults``       a ``LocalNet``'s fault injection by (peer, round, phase).
- ``taps``         what a ``LocalNet``'s peers sent (bodies by sender, recipient and path).
- ``netns``        network namespaces on one bridge, some "behind NAT", optionally shaped.
- ``wan``, ``wan_link``  the WAN emulator: a proxy per link with latency, rate, loss and faults.
- ``diloco``, ``blocktrain``, ``tlpp``, ``fomoe``  per protocol: rechecks and fault cases.
"""

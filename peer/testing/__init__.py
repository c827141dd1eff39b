"""Shipped test support (tests and scripts use it; nothing in the daemon does).

- ``localproc``    ``gossamer`` processes started through the CLI, their events read from stdout.
- ``localnet``     an in-process network of any protocol's roles behind real servers.
- ``faults``       a ``LocalNet``'s fault injection: what ``fail``, ``slow`` and ``crash`` declared,
                   applied to the frames, requests and phases of its peers.
- ``taps``         what a ``LocalNet``'s peers sent (bodies by sender, recipient and path).
- ``tlpp_runs``    a secure TL++ run's helper pin, allowlist and node command, for CLI processes.
- ``fomoe_hosts``  FoMoE expert hosts as CLI daemons: the run and the kill scenario.
- ``netns``        network namespaces on one bridge, some "behind NAT" (inbound connections
                   dropped), optionally shaped: the NAT test and the relay benchmark.
"""

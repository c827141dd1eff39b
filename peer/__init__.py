"""The runtime every protocol runs on: the peer daemon, its CLI, membership, reachability and what
roles share; never a protocol's roles (README.md here is the spec and the vocabulary).

- ``daemon``     one running peer: identity, DHT membership, servers, heartbeat, its roles, status.
- ``orchestrator``  the generic ``orchestrator`` role: the run owner's peer, serving the manifest.
- ``processes``  this host's process table: a process's children (killed when a peer exits at once).
- ``cancellation``  cancelling a peer's background tasks within a bound (a shutdown never hangs on one).
- ``serving``    what any peer serves and announces: role routes and methods, state, its record.
- ``plugin``     ``ProtocolPlugin`` (what a protocol brings) and ``PluginRegistry``.
- ``role``       ``Role``, ``ProtocolRole[S]`` and the ``RoleContext`` the daemon hands them.
- ``config``     ``PeerConfig``: the daemon's options (bounds and help on the fields), flags and TOML.
- ``errors``     the peer layer's exception tree.
- ``events``     machine-readable JSON event lines (``--events``).
- ``metrics``    Prometheus metrics and traffic counters of one daemon.
- ``device``     ``--device auto|cpu|cuda[:N]``.
- ``http_api``   the daemon's own ``/healthz``, ``/status``, ``/metrics`` and the swarm page (``/``).
- ``progress``   human progress lines (with a bar and an ETA) for a protocol's events.
- ``page``       the swarm page's static files (HTML, a small script, CSS).
- ``run``        who is in the run: manifests, signed records, admission, the live view, joining.
- ``kit``        what roles share: signed messaging, secure links, state sync, inboxes, ledgers,
                 rounds, checkpoints.
- ``reach``      reachability: the dial-back self-test (public / private) and relays.
- ``route``      chained TCP hops through hosts (BlockTrain inference routes).
- ``cli``        the ``gossamer`` command and its generic subcommands; presets."""

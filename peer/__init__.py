"""The composition root: the peer daemon, its CLI, and each protocol's roles (see
docs/ARCHITECTURE.md for the layers, the plugin contract and each protocol's message flow).

Map of the package:

- ``daemon``     one running peer: identity, DHT membership, servers, heartbeat, its roles.
- ``introspection`` what a daemon says about itself: state, ``/status``, metrics, peer rows.
- ``processes``  this host's process table: a process's children (killed when a peer exits at once).
- ``stopping``   cancelling a peer's background tasks within a bound (a shutdown never hangs on one).
- ``serving``    what any peer serves and announces: role routes and methods, state, its record.
- ``plugin``     ``ProtocolPlugin`` (what a protocol brings) and ``PluginRegistry``.
- ``role``       ``Role``, ``ProtocolRole[S]`` and the ``RoleContext`` the daemon hands them.
- ``config``     ``PeerConfig``: the daemon's options, from flags and an optional TOML file.
- ``errors``     the peer layer's exception tree.
- ``events``     machine-readable JSON event lines (``--events``).
- ``metrics``    Prometheus metrics and traffic counters of one daemon.
- ``device``     ``--device auto|cpu|cuda[:N]``.
- ``http_api``   the daemon's own ``/healthz``, ``/status``, ``/metrics`` and the swarm page (``/``).
- ``progress``   human progress lines (with a bar and an ETA) for a protocol's events.
- ``page``       the swarm page's static files (HTML, a small script, CSS).
- ``run``        who is in the run: manifests, signed records, admission, the live view, joining.
- ``kit``        what roles share: signed messaging, secure links, state sync, inboxes, ledgers,
                 the settings reader, checkpoints.
- ``reach``      reachability: the dial-back self-test (public / private) and the relay a
                 private peer is reached through.
- ``route``      chained TCP hops through hosts (BlockTrain inference routes).
- ``roles``      one folder per protocol, and the registry of their plugins (``PLUGINS``).
- ``cli``        the ``gossamer`` command and its generic subcommands; presets.
- ``testing``    shipped test support: local processes, an in-process network of roles.

Vocabulary (one word per concept, used everywhere in gossamer):

- **peer**: one daemon process with one Ed25519 identity; **peer id**: hex fingerprint of its
  public key (not hivemind's libp2p PeerID, which only addresses the DHT node).
- **run**: one training job; **run id** = ``<name>@<owner fingerprint prefix>``.
- **manifest**: the run's signed description, published in the DHT and over HTTP.
- **protocol**: the training method of a run (``run.protocol``), one plugin.
- **role**: what a peer does in a run. The generic ``orchestrator``; ``learner`` (diloco);
  ``block-coordinator``, ``block-worker``, ``block-server``, ``ar-stage`` (blocktrain);
  ``tlpp-server``, ``node``, ``helper`` (tlpp).
- **round**: one synchronisation period of a protocol (a learner's outer round, a block version,
  a TL++ virtual batch); its **ledger** accounts for every expected contribution.
- **route**: the chain of hosts a BlockTrain inference pass goes through; **traversal** means
  TL++'s traversal learning only.
"""

"""The ``gossamer`` command (generic subcommands only; protocols add theirs through their plugins).

- ``main``       the parser and the dispatch; the ``CommandKit`` plugins' commands get.
- ``flags``      one argparse flag per ``PeerConfig`` option (help from its field), kebab aliases.
- ``service``    running a daemon as a process: signals, the ready banner, clean or forced exit.
- ``status``     ``gossamer status``: the live peers of a run.
- ``swarm``      ``gossamer swarm``: an orchestrator and N peers as processes on loopback.
- ``presets``    built-in run configs for ``gossamer swarm --preset NAME``."""

"""Transport throughput benchmark: a float32 tensor between two processes on loopback.

Raw socket vs gossamer TCP vs gossamer HTTP vs hivemind's ``DecentralizedAverager``, plus gossamer
TCP and HTTP through an emulated 100 Mbit/s, 50 ms WAN link, all in one run so that the ratios
are measured side by side. See ``_transport_run`` for the rows and BENCHMARKS.md for results::

    .venv/bin/python scripts/bench/transport.py [--size_mb 100] [--repeats 5] [--skip_hivemind]
        [--skip_wan] [--relay | --only_relay] [--json scripts/bench/results/transport.json]
"""

import sys

from _transport_run import main

if __name__ == "__main__":
    sys.exit(main())

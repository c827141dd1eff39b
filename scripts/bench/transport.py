"""Transport throughput: a float32 tensor between two processes, raw socket vs gossamer TCP and
HTTP vs hivemind, and through an emulated 100 Mbit/s, 50 ms link (rows: ``_transport_run``)::

    .venv/bin/python scripts/bench/transport.py [--size_mb 100] [--repeats 5] [--skip_hivemind]
        [--skip_wan] [--relay | --only_relay] [--json scripts/bench/results/transport.json]"""

import sys

from _transport_run import main

if __name__ == "__main__":
    sys.exit(main())

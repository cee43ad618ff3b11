# Shared set-up for scripts/run and scripts/test (sourced, not run).
# Creates .venv when missing and (re)installs the project whenever pyproject.toml changed, so a
# fresh clone needs nothing but python3 (>= 3.11) on the PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "lmq needs Python >= 3.11 (found: $("$PY" --version 2>&1))" >&2
    exit 1
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "setup: creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.lmq-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)-${LMQ_EXTRAS:-base}"
if [[ ! -f "$stamp" ]] || [[ "$(cat "$stamp")" != "$want" ]]; then
    echo "setup: installing lmq into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -U pip >&2
    if [[ -n "${LMQ_EXTRAS:-}" ]]; then
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[$LMQ_EXTRAS]" >&2
    else
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT" >&2
    fi
    echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"

# Shared set-up for scripts/run and scripts/test (sourced, not run).
#
# A fresh clone needs nothing but python3 (>= 3.11) on the PATH: this creates .venv when missing
# and installs lmq into it (editable), with the extras the caller names in LMQ_EXTRAS
# (comma-separated: scripts/test asks for "spark,test", scripts/run for none unless the user
# exports LMQ_EXTRAS, e.g. LMQ_EXTRAS=spark ./scripts/run for the Spark example).
#
# Both scripts share the one virtualenv, and installing is incremental. The stamp
# .venv/.lmq-installed records the hash of pyproject.toml and the extras installed with it. pip
# runs only when pyproject.toml changed or an asked-for extra is missing, and then installs the
# union of the extras already there and the ones asked for, without -U: pip leaves every
# requirement that is already satisfied alone and never uninstalls anything. So ./scripts/run
# after ./scripts/test does nothing (a superset is fine), and ./scripts/test after ./scripts/run
# downloads only the extras. pip itself is upgraded once, when the virtualenv is created.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "lmq needs Python >= 3.11 (found: $("$PY" --version 2>&1))" >&2
    exit 1
fi

# One line per extra, sorted bytewise, no blanks: the form comm(1) compares.
_lmq_extras_lines() { tr ', ' '\n\n' <<<"$1" | sed '/^$/d' | LC_ALL=C sort -u; }
_lmq_only_in_first() { LC_ALL=C comm -23 <(_lmq_extras_lines "$1") <(_lmq_extras_lines "$2"); }
_lmq_in_both() { LC_ALL=C comm -12 <(_lmq_extras_lines "$1") <(_lmq_extras_lines "$2"); }

_lmq_setup() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "setup: creating $VENV" >&2
        "$PY" -m venv "$VENV" || return
        # The pip that comes with the interpreter may predate the metadata lmq's build writes.
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check -U pip >&2 || return
    fi
    local stamp="$VENV/.lmq-installed" hash have_hash="" have="" want declared unknown missing all
    hash="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
    if [[ -f "$stamp" ]]; then
        have_hash="$(sed -n 's/^pyproject=//p' "$stamp")"
        have="$(sed -n 's/^extras=//p' "$stamp")"
    fi
    want="${LMQ_EXTRAS:-}"
    declared="$("$VENV/bin/python" -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print(",".join(tomllib.load(f)["project"].get("optional-dependencies", {})))
' "$ROOT/pyproject.toml")" || return
    unknown="$(_lmq_only_in_first "$want" "$declared")"
    if [[ -n "$unknown" ]]; then
        echo "setup: lmq has no extra named $(paste -sd, - <<<"$unknown")" \
            "(pyproject.toml declares: $declared)" >&2
        return 1
    fi
    missing="$(_lmq_only_in_first "$want" "$have")"
    if [[ "$have_hash" == "$hash" && -z "$missing" ]]; then
        return 0
    fi
    # Keep what is installed (minus any extra pyproject.toml no longer declares) and add the rest.
    all="$(_lmq_in_both "$have,$want" "$declared" | paste -sd, -)"
    echo "setup: installing lmq${all:+[$all]} into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT${all:+[$all]}" >&2 \
        || return
    printf 'pyproject=%s\nextras=%s\n' "$hash" "$all" >"$stamp"
}

# Two scripts started at once (./scripts/run in one terminal, ./scripts/test in another) take
# turns at installing. The lock is released before the caller execs lmqd or pytest. _lmq_setup
# returns each failure itself, since errexit does not apply inside a function called as `f || exit`.
if command -v flock >/dev/null 2>&1; then
    mkdir -p "$VENV"
    exec 9>"$VENV/.lmq-setup.lock"
    flock 9
    _lmq_setup || exit
    exec 9>&-
else
    _lmq_setup || exit
fi
unset -f _lmq_setup _lmq_extras_lines _lmq_only_in_first _lmq_in_both
export PATH="$VENV/bin:$PATH"

# Sourced by scripts/serve and scripts/test: a project venv installed from the
# hash-pinned lock files (re-installed only when a lock file changes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PREFIXPIN_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

ensure_venv() {  # $1: lock file
  local lock="$ROOT/$1" stamp
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  stamp="$VENV/.installed-$(sha256sum "$lock" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r "$lock"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT" \
      || "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$ROOT"
    touch "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
}

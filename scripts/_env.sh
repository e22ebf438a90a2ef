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
  stamp="$VENV/.installed-$(sha256sum "$lock" "$ROOT/requirements-build.lock" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    # setuptools from its own lock, with the rest: a fresh venv's (Debian's 66, no wheel)
    # cannot build an editable install, and pip's build isolation would fetch an unpinned one.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes \
      -r "$ROOT/requirements-build.lock" -r "$lock"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
    touch "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
}

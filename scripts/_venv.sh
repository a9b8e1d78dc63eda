# Sourced by scripts/test and scripts/demo: create or refresh .venv with unidist and every extra.
# The install is redone only when pyproject.toml or constraints.txt change (a stamp file records them).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "unidist needs Python >= 3.10; '$PYTHON' is $("$PYTHON" --version 2>&1). Set PYTHON=python3.11." >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
stamp="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ "$(cat .venv/.unidist-stamp 2>/dev/null || true)" != "$stamp" ]; then
  echo "[setup] installing unidist[dev] with pinned versions (torch 2.7.0 is large: a few minutes the first time)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev]"
  echo "$stamp" > .venv/.unidist-stamp
fi

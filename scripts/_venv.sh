# Sourced by scripts/test, scripts/demo and scripts/gpu-check: create or refresh virtualenvs.
#
#   ensure_venv DIR LABEL PIP_INSTALL_ARGS...
#
# creates DIR with $PYTHON (python3 by default) if it is missing and runs
# `pip install PIP_INSTALL_ARGS...` in it whenever the stamp changes: the stamp covers
# pyproject.toml, both constraints files and the arguments themselves, so editing any of them
# refreshes the environment and nothing else does.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "unidist needs Python >= 3.10; '$PYTHON' is $("$PYTHON" --version 2>&1). Set PYTHON=python3.11." >&2
  exit 2
fi

# pip's notes about index folders that do not exist on this machine are noise, not warnings.
_quiet_pip() {
  "$@" 2> >(grep -v "^WARNING: Location '" >&2)
}

ensure_venv() {
  local dir=$1 label=$2
  shift 2
  local stamp
  stamp="$( (cat pyproject.toml constraints.txt constraints-tools.txt; printf '%s\n' "$@") | sha256sum | cut -c1-16)"
  if [ ! -x "$dir/bin/python" ]; then
    echo "[setup:$label] creating $dir with $("$PYTHON" --version)"
    "$PYTHON" -m venv "$dir"
  fi
  if [ "$(cat "$dir/.unidist-stamp" 2>/dev/null || true)" != "$stamp" ]; then
    echo "[setup:$label] pip install $* (torch is large: a few minutes the first time)"
    local started=$SECONDS
    # Explicit returns: a caller's `|| ...` turns errexit off in here, and a failed install
    # must never write the stamp that skips the next attempt.
    _quiet_pip "$dir/bin/python" -m pip install --quiet --upgrade pip || return 1
    _quiet_pip "$dir/bin/python" -m pip install --quiet "$@" || return 1
    echo "$stamp" > "$dir/.unidist-stamp"
    echo "[setup:$label] installed in $((SECONDS - started))s"
  fi
}

# The pinned environment (.venv): what the demo and the first test run use.
ensure_pinned_venv() {
  ensure_venv .venv pinned -c constraints.txt -e ".[dev]"
}

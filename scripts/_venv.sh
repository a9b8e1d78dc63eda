# Sourced by scripts/test, scripts/demo and scripts/gpu-check: create or refresh virtualenvs.
#
#   ensure_venv DIR LABEL PIP_INSTALL_ARGS...
#
# creates DIR with $PYTHON (python3 by default) if it is missing and runs
# `pip install PIP_INSTALL_ARGS...` in it whenever the stamp changes: the stamp covers
# pyproject.toml, both constraints files and the arguments themselves, so editing any of them
# refreshes the environment and nothing else does.
#
# The installer is uv's `uv pip install` (pinned in constraints-tools.txt, in .venv-uv) wherever
# it installs what pip would: it is given pip's own configuration (`pip config list`: indexes,
# find-links, constraint files, certificate, timeout) and pip's choice among indexes (the best
# version on any), and compiles the bytecode as pip does. It downloads and unpacks in parallel:
# the pinned environment from a fresh clone took 51 s against pip's 130 s (2 cores, empty
# caches, 2026-12-06). A pip setting uv is not told of, or a uv that cannot be set up, leaves
# the installing to pip, with one line that says why; UNIDIST_INSTALLER=pip chooses pip.
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

# Fills _uv_args and _uv_env with pip's configuration, as uv's options and environment; fails,
# with _uv_why naming the setting, where one has no counterpart here.
_uv_settings_from_pip() {
  local line key value item config
  _uv_args=(--index-strategy unsafe-best-match --compile-bytecode) _uv_env=()
  config=$(.venv-uv/bin/python -m pip config list 2>/dev/null) || {
    _uv_why="pip config list failed"
    return 1
  }
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    key=${line%%=*} value=${line#*=}
    value=${value#\'} value=${value%\'}
    case ${key##*.} in
      index-url) _uv_args+=(--index-url "$value") ;;
      extra-index-url) for item in $value; do _uv_args+=(--extra-index-url "$item"); done ;;
      find-links) for item in $value; do _uv_args+=(--find-links "$item"); done ;;
      constraint) for item in $value; do _uv_args+=(--constraint "$item"); done ;;
      cert) _uv_env+=("SSL_CERT_FILE=$value") ;;
      timeout | default-timeout) _uv_env+=("UV_HTTP_TIMEOUT=$value") ;;
      disable-pip-version-check | no-color | progress-bar | quiet | verbose | root-user-action) ;;
      *)
        _uv_why="pip's setting $key='$value' has no uv counterpart here"
        return 1
        ;;
    esac
  done <<<"$config"
}

# Sets _installer to uv (setting .venv-uv up the first time) or pip. Call it before starting set-ups
# in the background: they then share .venv-uv, never both create it.
choose_installer() {
  [ -z "${_installer:-}" ] || return 0
  _installer=pip
  [ "${UNIDIST_INSTALLER:-uv}" != pip ] || return 0
  local uv why
  uv=$(grep -oE '^uv==[^ ]+' constraints-tools.txt)
  if [ "$(cat .venv-uv/.unidist-stamp 2>/dev/null || true)" != "$uv" ]; then
    why=$(
      { [ -x .venv-uv/bin/python ] || "$PYTHON" -m venv .venv-uv; } 2>&1 \
        && _quiet_pip .venv-uv/bin/python -m pip install --quiet "$uv" 2>&1
    ) || {
      echo "[setup] pip installs: $uv could not be set up in .venv-uv: ${why:-no reason given}"
      return 0
    }
    echo "$uv" >.venv-uv/.unidist-stamp
  fi
  _uv_settings_from_pip || {
    echo "[setup] pip installs: $_uv_why"
    return 0
  }
  _installer=uv
}

# pip install ARGS... into the environment DIR, by the chosen installer.
_install() {
  local dir=$1
  shift
  if [ "$_installer" = uv ]; then
    _quiet_pip env "${_uv_env[@]}" .venv-uv/bin/uv pip install --quiet \
      --python "$dir/bin/python" "${_uv_args[@]}" "$@"
  else
    _quiet_pip "$dir/bin/python" -m pip install --quiet "$@"
  fi
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
    choose_installer
    echo "[setup:$label] $_installer pip install $* (torch is large: a minute or more the first time)"
    local started=$SECONDS
    # Explicit returns: a caller's `|| ...` turns errexit off in here, and a failed install
    # must never write the stamp that skips the next attempt. pip itself is upgraded too: the
    # environment's pip is what users of it reach for.
    _install "$dir" --upgrade pip || return 1
    _install "$dir" "$@" || return 1
    echo "$stamp" > "$dir/.unidist-stamp"
    echo "[setup:$label] installed in $((SECONDS - started))s"
  fi
}

# The pinned environment (.venv): what the demo and the first test run use.
ensure_pinned_venv() {
  ensure_venv .venv pinned -c constraints.txt -e ".[dev]"
}

#!/usr/bin/env bash
# Run the owners' own distributed test suites -- Ignite's tests/ignite/distributed and
# Composer's tests/utils/test_dist.py -- either against the owners' libraries ("owner")
# or, rewritten by ignite-shim.sed / composer-shim.sed, against unidist.compat ("shim").
#
#   usage: run.sh owner|shim PYTHON [all|ignite|composer]
#
# The owners' tests are fetched at run time (a local bare mirror when present, else a
# shallow git clone of the tag); nothing of theirs is kept in this folder.
# Environment knobs (defaults in brackets):
#   UNIDIST_SRC   unidist's src dir put on PYTHONPATH [../../src from here, else /work/main/src]
#   OUT_ROOT      where fetched trees, logs and JUnit files go [/tmp/owner-suites/runs]
#   MIRROR_ROOT   folder of bare mirrors named owner+name/repo [/work/.mirror]
#   IGNITE_REF    [v<installed pytorch-ignite>, else v0.5.5]
#   COMPOSER_REF  [v<installed mosaicml>, else v0.32.1]
#   NPROC_CAP     2: apply nproc-cap.sed (4 spawned CPU workers -> 2) and deselect the
#                 emulated 2x2 multi-node smoke test; 0: run the tests exactly as written [2]
#   DIST_WS       ranks for the multi-rank runs [2]
#   SUITE_TIMEOUT seconds per pytest invocation [1800]
set -uo pipefail

MODE=${1:-}
PY=${2:-}
WHICH=${3:-all}
if [[ "$MODE" != owner && "$MODE" != shim ]] || [[ -z "$PY" ]]; then
  echo "usage: $0 owner|shim PYTHON [all|ignite|composer]" >&2
  exit 2
fi
PY=$(command -v "$PY") || { echo "no such python: $2" >&2; exit 2; }
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")  # absolute, symlink kept (a venv's python)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIB=$HERE/lib
if [[ -z "${UNIDIST_SRC:-}" ]]; then
  if [[ -d "$HERE/../../src/unidist" ]]; then UNIDIST_SRC=$(cd "$HERE/../../src" && pwd); else UNIDIST_SRC=/work/main/src; fi
fi
OUT_ROOT=${OUT_ROOT:-/tmp/owner-suites/runs}
MIRROR_ROOT=${MIRROR_ROOT:-/work/.mirror}
NPROC_CAP=${NPROC_CAP:-2}
DIST_WS=${DIST_WS:-2}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-1800}

export PYTHONPATH=$UNIDIST_SRC
export PATH="$(dirname "$PY"):$PATH"   # torchrun / composer / pytest of that venv
export PYTHONDONTWRITEBYTECODE=1
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT NODE_RANK

pyver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null; }
has() { "$PY" -c "import $1" >/dev/null 2>&1; }
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('',0)); print(s.getsockname()[1])"; }

TV=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])") || { echo "torch not importable with $PY" >&2; exit 2; }
IGV=$(pyver pytorch-ignite); CMV=$(pyver mosaicml)
IGNITE_REF=${IGNITE_REF:-v${IGV:-0.5.5}}
COMPOSER_REF=${COMPOSER_REF:-v${CMV:-0.32.1}}

RUN=$OUT_ROOT/$MODE-torch$TV
RES=$RUN/results
mkdir -p "$RES"

# fetch_tree owner/name REF DEST PATH... : copy PATHs of tag REF into DEST
fetch_tree() {
  local slug=$1 ref=$2 dest=$3; shift 3
  local mirror=$MIRROR_ROOT/${slug/\//+}/repo
  mkdir -p "$dest"
  if [[ -d "$mirror" ]] && git --git-dir="$mirror" rev-parse -q --verify "$ref^{commit}" >/dev/null; then
    echo "fetch: $slug $ref from mirror $mirror"
    git --git-dir="$mirror" archive "$ref" -- "$@" | tar -x -C "$dest"
  else
    local cache=$OUT_ROOT/src-cache/${slug/\//+}-$ref
    if [[ ! -d "$cache/.git" ]]; then
      echo "fetch: git clone --depth 1 --branch $ref https://github.com/$slug"
      rm -rf "$cache"
      git clone -q --depth 1 --branch "$ref" "https://github.com/$slug" "$cache" || return 1
    fi
    (cd "$cache" && tar -c "$@") | tar -x -C "$dest"
  fi
}

shim_ok() {  # both shim modules importable?
  has unidist.compat.ignite && has unidist.compat.composer
}
if [[ $MODE == shim ]] && ! shim_ok; then
  echo "shim mode: unidist.compat.ignite / unidist.compat.composer not importable from $UNIDIST_SRC" >&2
  "$PY" -c "import unidist.compat.ignite, unidist.compat.composer" 2>&1 | tail -3 >&2
  exit 3
fi

report() {  # label note log junit...
  local label=$1 note=$2 log=$3 last; shift 3
  last=$(sed 's/\x1b\[[0-9;]*m//g' "$log" 2>/dev/null | grep -E '(passed|failed|skipped|deselected|error|no tests ran).* in [0-9.]+s' | tail -n 1)
  [[ -n "$last" ]] && note="$note; pytest: ${last//=/}"
  "$PY" "$LIB/summarize.py" --label "$label" --root "$ROOT" ${INTERNAL:+--internal "$INTERNAL"} \
    ${note:+--note "$note"} "$@" | tee -a "$SUMMARY"
}

# ----------------------------------------------------------------------------- Ignite
run_ignite() {
  ROOT=$RUN/ignite SUMMARY=$RES/ignite-summary.txt
  rm -rf "$ROOT" "$RES"/ignite-*; : >"$SUMMARY"
  fetch_tree pytorch/ignite "$IGNITE_REF" "$ROOT" pyproject.toml tests/__init__.py \
    tests/ignite/__init__.py tests/ignite/conftest.py tests/ignite/distributed || {
    echo "ignite distributed, $MODE, torch $TV: not run (could not fetch $IGNITE_REF)" | tee -a "$SUMMARY"; return; }
  local pyfiles deselect=()
  mapfile -t pyfiles < <(find "$ROOT/tests/ignite/distributed" -name '*.py' | sort)
  if [[ $NPROC_CAP == 2 ]]; then
    sed -i -f "$HERE/nproc-cap.sed" "${pyfiles[@]}"
    deselect=(--deselect tests/ignite/distributed/test_launcher.py::test_smoke_test_check_idist_parallel_spawn_multinode_n_procs_gloo)
  fi
  INTERNAL=
  if [[ $MODE == shim ]]; then
    sed -i -f "$HERE/ignite-shim.sed" "${pyfiles[@]}"
    echo "  (shim rewrite: $(cat "${pyfiles[@]}" | grep -c 'unidist\.compat\.ignite') import lines now name unidist.compat.ignite)" >"$RES/ignite-rewrite.txt"
    INTERNAL=$RES/ignite-internal.tsv
    "$PY" "$LIB/internal_tests.py" "$ROOT" >"$INTERNAL"
  fi
  # faulthandler_timeout: a hung test dumps every thread's stack into the log
  local common=(-p no:cacheprovider -q -rfE --color=no -o faulthandler_timeout=240 "${deselect[@]}")
  has pytest_timeout && common+=(--timeout=300)
  # 1) the whole folder in one process (WORLD_SIZE unset; gloo groups of size 1)
  # PET_MASTER_PORT: the torchrun these tests start would otherwise take the shared default 29500
  (cd "$ROOT" && CUDA_VISIBLE_DEVICES="" PET_MASTER_PORT=$(free_port) timeout -k 20 "$SUITE_TIMEOUT" \
      "$PY" -m pytest tests/ignite/distributed \
      "${common[@]}" --junitxml="$RES/ignite-single.xml") >"$RES/ignite-single.log" 2>&1
  local rc1=$?
  # 2) Ignite's own multi-rank way (tests/common_test_functionality.sh): each xdist worker is a rank
  (cd "$ROOT" && CUDA_VISIBLE_DEVICES="" WORLD_SIZE=$DIST_WS timeout -k 20 "$SUITE_TIMEOUT" "$PY" -m pytest \
      tests/ignite/distributed -m distributed --dist=each --tx "$DIST_WS*popen//python=$PY" \
      "${common[@]}" --junitxml="$RES/ignite-dist.xml") >"$RES/ignite-dist.log" 2>&1
  local rc2=$?
  report "ignite distributed, $MODE, torch $TV, 1 process" "rc=$rc1" "$RES/ignite-single.log" "$RES/ignite-single.xml"
  report "ignite distributed, $MODE, torch $TV, -m distributed x$DIST_WS ranks (xdist --dist=each; counts are test x rank)" \
    "rc=$rc2" "$RES/ignite-dist.log" "$RES/ignite-dist.xml"
  [[ -f "$RES/ignite-rewrite.txt" ]] && tee -a "$SUMMARY" <"$RES/ignite-rewrite.txt"
  if [[ -n "$INTERNAL" ]]; then
    echo "  ($(wc -l <"$INTERNAL") test functions reach Ignite internals: no counterpart (internal); list in $INTERNAL)" | tee -a "$SUMMARY"
  fi
}

# --------------------------------------------------------------------------- Composer
run_composer() {
  ROOT=$RUN/composer SUMMARY=$RES/composer-summary.txt
  rm -rf "$ROOT" "$RES"/composer-*; : >"$SUMMARY"
  INTERNAL=
  fetch_tree mosaicml/composer "$COMPOSER_REF" "$ROOT" pyproject.toml tests/__init__.py tests/conftest.py \
    tests/fixtures tests/common tests/utils/__init__.py tests/utils/test_dist.py || {
    echo "composer dist, $MODE, torch $TV: not run (could not fetch $COMPOSER_REF)" | tee -a "$SUMMARY"; return; }
  local note=""
  if ! has composer; then
    if [[ $MODE == owner ]]; then
      echo "composer dist, owner, torch $TV: not run (mosaicml not installed for $PY)" | tee -a "$SUMMARY"; return
    fi
    # shim without Composer: harness stand-in for Composer's conftest/fixtures
    rm -rf "$ROOT/tests/fixtures" "$ROOT/tests/common"
    cp "$LIB/composer_min_conftest.py" "$ROOT/tests/conftest.py"
    # its pytest config names a Composer warning class; drop that one filter
    sed -i "/ignore::composer\./d" "$ROOT/pyproject.toml"
    note="Composer not installed: lib/composer_min_conftest.py used"
  elif ! has mlflow; then
    cp "$LIB/composer_overrides_conftest.py" "$ROOT/tests/utils/conftest.py"
    note="mlflow missing: setup_mlflow_tracking overridden"
  fi
  has pytest_codeblocks || sed -i 's/--codeblocks //' "$ROOT/pyproject.toml"
  if [[ $MODE == shim ]]; then
    sed -i -f "$HERE/composer-shim.sed" "$ROOT/tests/utils/test_dist.py"
    grep -q '^import unidist.compat.composer as dist' "$ROOT/tests/utils/test_dist.py" ||
      note="${note:+$note; }WARNING: composer-shim.sed matched nothing"
  fi
  # 1) Composer's `make test`: one process, WORLD_SIZE=1 (world_size(2) tests are deselected)
  (cd "$ROOT" && WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 timeout -k 20 "$SUITE_TIMEOUT" "$PY" -m pytest tests/utils/test_dist.py \
      -p no:cacheprovider -q -rfE --color=no --junitxml="$RES/composer-single.xml") >"$RES/composer-single.log" 2>&1
  local rc1=$?
  # 2) Composer's `make test-dist WORLD_SIZE=2`: their launcher, one pytest per rank
  local port launcher
  port=$(free_port)
  if has composer; then
    launcher=("$PY" -m composer.cli.launcher -n "$DIST_WS" --master_port "$port"
      --stdout "$RES/composer-dist-rank{rank}.stdout" --stderr "$RES/composer-dist-rank{rank}.stderr")
  else
    launcher=("$PY" -m torch.distributed.run --nproc-per-node "$DIST_WS" --master-port "$port")
  fi
  (cd "$ROOT" && timeout -k 20 "$SUITE_TIMEOUT" "${launcher[@]}" "$LIB/rank_pytest.py" \
      "$RES/composer-dist-rank{rank}.xml" tests/utils/test_dist.py -p no:cacheprovider -q -rfE --color=no) \
      >"$RES/composer-dist.log" 2>&1
  local rc2=$?
  report "composer dist, $MODE, torch $TV, 1 process (WORLD_SIZE=1)" "rc=$rc1${note:+; $note}" "$RES/composer-single.log" "$RES/composer-single.xml"
  local xs=()
  for ((r = 0; r < DIST_WS; r++)); do xs+=("$RES/composer-dist-rank$r.xml"); done
  report "composer dist, $MODE, torch $TV, ${launcher[2]} x$DIST_WS ranks (counts are test x rank)" \
    "rc=$rc2${note:+; $note}" "$RES/composer-dist.log" "${xs[@]}"
}

echo "mode=$MODE python=$PY torch=$TV ignite=${IGV:-none}@$IGNITE_REF composer=${CMV:-none}@$COMPOSER_REF unidist_src=$UNIDIST_SRC"
echo "results: $RES"
case $WHICH in
  all) run_ignite; run_composer ;;
  ignite) run_ignite ;;
  composer) run_composer ;;
  *) echo "unknown suite: $WHICH" >&2; exit 2 ;;
esac
echo "---- summary ($RES)"
case $WHICH in all) cat "$RES/ignite-summary.txt" "$RES/composer-summary.txt" ;; *) cat "$RES/$WHICH-summary.txt" ;; esac

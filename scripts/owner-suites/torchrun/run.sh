#!/usr/bin/env bash
# Run torch's own torchrun tests (test/distributed/launcher/test_run.py of the tag that
# matches the installed torch) once as written (baseline: torchrun) and RUNS times with
# `unidist launch` in torchrun's place (unidist-launch.sed + unidist_as_torchrun.py).
#
#   usage: run.sh PYTHON [RUNS=5]
#
# torch's test files are fetched at run time, never kept in this repo; see README.md.
# Environment knobs [defaults]:
#   UNIDIST_SRC   unidist's src dir, first on PYTHONPATH [../../../src from here]
#   TORCH_TAG     pytorch tag to fetch [v<installed torch>, then lower patch releases]
#   MIRROR_ROOT   bare mirrors named owner+name/repo [/work/.mirror]
#   CACHE_ROOT    hand-seeded copies, CACHE_ROOT/<tag>/ (last resort) [/tmp/torchrun-suite]
#   OUT_ROOT      work trees, logs, JUnit XML, summary [/tmp/torchrun-suite/runs]
#   BASELINE      1: also run the original module once against torchrun [1]
#   TEST_TIMEOUT  seconds per test (pytest-timeout) [300]; SUITE_TIMEOUT per pytest run [3600]
#   NETNS         1: run each pytest in a private network namespace (unshare -n, loopback only)
#                 so that other jobs' ports (torchrun's default 29500) cannot collide; needs
#                 root, unshare and ip; 0: the host's network [1 where possible]
set -uo pipefail

PY=${1:-}
RUNS=${2:-5}
if [[ -z "$PY" || ! "$RUNS" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 PYTHON [RUNS]" >&2
  exit 2
fi
PY=$(command -v "$PY") || { echo "no such python: $1" >&2; exit 2; }
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
UNIDIST_SRC=${UNIDIST_SRC:-$(cd "$HERE/../../../src" 2>/dev/null && pwd || echo /work/main/src)}
MIRROR_ROOT=${MIRROR_ROOT:-/work/.mirror}
CACHE_ROOT=${CACHE_ROOT:-/tmp/torchrun-suite}
OUT_ROOT=${OUT_ROOT:-/tmp/torchrun-suite/runs}
BASELINE=${BASELINE:-1}
TEST_TIMEOUT=${TEST_TIMEOUT:-300}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-3600}
NETNS=${NETNS:-1}
if [[ "$NETNS" == 1 ]] && ! { [[ $(id -u) == 0 ]] && command -v unshare >/dev/null && command -v ip >/dev/null &&
  unshare -n ip link set lo up 2>/dev/null; }; then
  echo "NETNS=1 not possible here (needs root, unshare, ip): using the host's network" >&2
  NETNS=0
fi

TV=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])") ||
  { echo "torch not importable with $PY" >&2; exit 2; }
"$PY" -c "import pytest, pytest_timeout" 2>/dev/null || { echo "$PY lacks pytest/pytest-timeout" >&2; exit 2; }
# torch.testing._internal (imported by the tests) needs expecttest; installed into a private
# folder on PYTHONPATH, never into the venv.
PYV=$("$PY" -c "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')")
DEPS=$OUT_ROOT/deps-py$PYV
if ! "$PY" -c "import expecttest" 2>/dev/null && ! PYTHONPATH=$DEPS "$PY" -c "import expecttest" 2>/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check --target "$DEPS" expecttest ||
    { echo "cannot install expecttest (needed by torch.testing._internal)" >&2; exit 2; }
fi

# Tags to try: TORCH_TAG, else v<installed>, then the lower patch releases of that minor.
if [[ -n "${TORCH_TAG:-}" ]]; then
  TAGS=("$TORCH_TAG")
else
  IFS=. read -r MA MI PA <<<"$TV"
  TAGS=()
  for ((p = ${PA:-0}; p >= 0; p--)); do TAGS+=("v$MA.$MI.$p"); done
fi
FILES=(test_run.py bin/test_script.py bin/test_script.sh bin/test_script_init_method.py
  bin/test_script_is_torchelastic_launched.py script_deviceid.py)
OPTIONAL=script_deviceid.py  # only newer tags have it (a GPU-only test uses it)
SRC=test/distributed/launcher

RUN=$OUT_ROOT/torch$TV
SUITE=$RUN/suite
rm -rf "$SUITE"
mkdir -p "$SUITE/bin" "$RUN"

fetch_mirror() {  # tag
  local git=$MIRROR_ROOT/pytorch+pytorch/repo
  [[ -d "$git" ]] && git --git-dir="$git" rev-parse -q --verify "$1^{commit}" >/dev/null || return 1
  local f
  for f in "${FILES[@]}"; do
    git --git-dir="$git" show "$1:$SRC/$f" >"$SUITE/$f" 2>/dev/null ||
      { rm -f "$SUITE/$f"; [[ "$f" == "$OPTIONAL" ]] || return 1; }
  done
  echo "git mirror $git, tag $1"
}
fetch_curl() {  # tag
  command -v curl >/dev/null || return 1
  local f
  for f in "${FILES[@]}"; do
    curl -fsSL --max-time 30 -o "$SUITE/$f" "https://raw.githubusercontent.com/pytorch/pytorch/$1/$SRC/$f" ||
      { rm -f "$SUITE/$f"; [[ "$f" == "$OPTIONAL" ]] || return 1; }
  done
  echo "https://raw.githubusercontent.com/pytorch/pytorch/$1/$SRC/"
}
fetch_cache() {  # tag
  local dir=$CACHE_ROOT/$1 f
  [[ -f "$dir/test_run.py" ]] || return 1
  for f in "${FILES[@]}"; do
    if [[ -f "$dir/$f" ]]; then cp "$dir/$f" "$SUITE/$f"; elif [[ "$f" != "$OPTIONAL" ]]; then return 1; fi
  done
  echo "hand-seeded cache $dir (NOT fetched from the tag; see $dir/PROVENANCE)"
}
FROM=""
for TAG in "${TAGS[@]}"; do
  for how in fetch_mirror fetch_curl fetch_cache; do
    FROM=$($how "$TAG") && break 2
    FROM=""
  done
done
if [[ -z "$FROM" ]]; then
  echo "could not fetch $SRC for ${TAGS[*]} (no mirror, offline, no cache in $CACHE_ROOT)" >&2
  exit 1
fi
chmod +x "$SUITE"/bin/*
sed -f "$HERE/unidist-launch.sed" "$SUITE/test_run.py" >"$SUITE/test_run_unidist.py"
grep -q '^import unidist_as_torchrun as launch' "$SUITE/test_run_unidist.py" ||
  { echo "unidist-launch.sed did not apply to this test_run.py" >&2; exit 1; }
cp "$HERE/unidist_as_torchrun.py" "$SUITE/"
{
  echo "torch $TV ($PY), tests of $TAG from: $FROM"
  echo "unidist: $UNIDIST_SRC ($(git -C "$UNIDIST_SRC" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "date: $(date -u +%FT%TZ)  host cores: $(nproc)  private network namespace: $NETNS"
} | tee "$RUN/about.txt"

export PYTHONPATH=$UNIDIST_SRC:$SUITE:$DEPS PYTHONDONTWRITEBYTECODE=1
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT NODE_RANK GROUP_RANK
while IFS= read -r v; do unset "$v"; done < <(env | sed -n 's/^\(PET_[A-Z_]*\)=.*/\1/p')

pytest_run() {  # label file
  local label=$1 file=$2
  echo "== $label: $file ($(date -u +%T))"
  local wrap=()
  [[ "$NETNS" == 1 ]] && wrap=(unshare -n sh -c 'ip link set lo up && exec "$@"' netns)
  (cd "$SUITE" && timeout -k 30 "$SUITE_TIMEOUT" "${wrap[@]}" "$PY" -m pytest "$file" \
    -p no:cacheprovider -p no:xdist -q -rfEs --timeout="$TEST_TIMEOUT" -o junit_family=xunit1 \
    -o junit_logging=all --junitxml="$RUN/$label.xml") >"$RUN/$label.log" 2>&1
  echo "   rc=$? $(tail -n 1 "$RUN/$label.log")"
}

ARGS=()
if [[ "$BASELINE" == 1 ]]; then
  pytest_run baseline-torchrun test_run.py
  ARGS+=("baseline-torchrun=$RUN/baseline-torchrun.xml")
fi
for ((i = 1; i <= RUNS; i++)); do
  pytest_run "unidist-$i" test_run_unidist.py
  ARGS+=("unidist-$i=$RUN/unidist-$i.xml")
done
"$PY" "$HERE/summarize.py" "$SUITE/test_run.py" "${ARGS[@]}" | tee "$RUN/summary.txt"
echo "logs, JUnit XML and summary: $RUN"

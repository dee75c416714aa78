#!/usr/bin/env bash
# ADAPT=full against ADAPT=query of the zero-label recipe on one BEIR folder, on the same pseudo-queries.
#   bench/adapt_query.sh DATA WORK [make variables…]
# Runs `make -C examples/beir ADAPT=full` in WORK/full, then ADAPT=query in WORK/query on hard links of the full
# run's pseudo-queries and BM25 runs (what ADAPT does not change; qgen is the slow part), times each, and prints
# each run's eval.txt and a second eval with the base hybrid first (p of every run against it). Holds
# /tmp/retrctl-bench.lock for the whole run: one real-model job at a time on the shared box. SKIP_FULL=1 runs only
# ADAPT=query, on the pseudo-queries an earlier (even unfinished) ADAPT=full run in WORK/full made.
set -euo pipefail
DATA=$(realpath "$1"); WORK=$2; shift 2; EXTRA=("$@")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
export PYTHONPATH=$ROOT
mkdir -p "$WORK"
exec 9>/tmp/retrctl-bench.lock
flock 9
run() {  # run NAME ADAPT: make, timed into WORK/NAME.minutes
  local start=$(date +%s)
  make -C "$ROOT/examples/beir" PY="$PY" DATA="$DATA" W="$(realpath "$WORK")/$1" ADAPT="$2" "${EXTRA[@]}" >&2
  awk -v s="$start" -v e="$(date +%s)" 'BEGIN{printf "%.1f\n", (e - s) / 60}' > "$WORK/$1.minutes"
}
[ "${SKIP_FULL:-0}" = 1 ] || run full full
mkdir -p "$WORK/query"
for f in crops dev-crops qgen dev-qgen pseudo dev generated bm25 pseudo-bm25 dev-bm25; do
  for g in "$WORK/full/$f".{jsonl,trec} "$WORK/full/$f".{jsonl,trec}.manifest.json; do
    [ -e "$g" ] && cp -al "$g" "$WORK/query/"
  done
done
cp -al "$WORK/full/idx-bm25" "$WORK/query/" && rm -f "$WORK/query/idx-bm25/index.lock"
run query query
for d in full query; do
  [ -f "$WORK/$d/eval.txt" ] || continue
  echo "== ADAPT=$d ($(cat "$WORK/$d.minutes") min, pseudo-queries reused by query)"
  cat "$WORK/$d/eval.txt"
  echo "-- p against the base hybrid"
  "$PY" -m retrctl eval "$WORK/$d/base-hybrid.trec" "$WORK/$d/adapted.trec" "$WORK/$d/delivered.trec" \
    --qrels "$DATA" -m nDCG@10 -m R@100
done

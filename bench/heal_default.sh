#!/usr/bin/env bash
# Benchmark: the README's heal step with its default flags, end to end, on a CPU: MiniLM cut by
# `prune minilm --drop-layers 3 --calibration HEAL`, healed by `train --corpus HEAL --model small --teacher minilm`
# (no labels; the heal's own defaults), then the unpruned, cut and healed models each indexed and searched on every
# EVAL set (`search --hits 100`, ArguAna and Quora with `--remove-query`) and scored by `eval` (its paired t-test
# against the unpruned model). The heal's wall seconds are the figure the 30 minutes are about.
#
#    flock /tmp/retrctl-bench.lock bash bench/heal_default.sh        # HEAL=scifact, EVAL="scifact arguana": ~50 min
#
# HEAL and EVAL name BEIR folders under DATA (../shared/data); WORK keeps every output (a finished one is reused,
# so a run stopped part-way continues; delete WORK to measure again); HEAL_FLAGS are added to the heal (e.g.
# "--lr 1e-3"); SMOKE="--max-steps 2" caps the heal (a smoke test, e.g. with MODEL a tiny model dir). Seconds go
# to WORK/times.tsv, eval's tables to stdout, logs to stderr.
set -euo pipefail

DATA=${DATA:-../shared/data}
HEAL=${HEAL:-scifact}
EVAL=${EVAL:-scifact arguana}
MODEL=${MODEL:-minilm}
DROP=${DROP:-3}
WORK=${WORK:-bench/work/heal-default}
HEAL_FLAGS=${HEAL_FLAGS:-}
SMOKE=${SMOKE:-}
PY=${PY:-python3}
mkdir -p "$WORK"

timed() {  # timed NAME OUTPUT retrctl-args...: runs the command unless OUTPUT exists; "NAME<TAB>seconds" to times.tsv
    local name=$1 output=$2 start=$SECONDS
    shift 2
    [ -e "$output" ] && return 0
    echo "== $name: retrctl $*" >&2
    "$PY" -m retrctl "$@"
    printf '%s\t%s\n' "$name" $((SECONDS - start)) >>"$WORK/times.tsv"
}

timed prune "$WORK/drop-$DROP" prune "$MODEL" --drop-layers "$DROP" --calibration "$DATA/$HEAL" -o "$WORK/drop-$DROP"
# shellcheck disable=SC2086  # HEAL_FLAGS and SMOKE are lists of flags
timed heal "$WORK/healed" train --corpus "$DATA/$HEAL" --model "$WORK/drop-$DROP" --teacher "$MODEL" $HEAL_FLAGS \
    $SMOKE -o "$WORK/healed"

for set in $EVAL; do
    extra=()
    case $set in *arguana* | *quora*) extra=(--remove-query) ;; esac
    runs=()
    for m in unpruned "drop-$DROP" healed; do
        path=$WORK/$m
        [ "$m" = unpruned ] && path=$MODEL
        timed "index $set $m" "$WORK/idx-$set-$m" index "$DATA/$set" --model "$path" --batch-size 32 \
            -o "$WORK/idx-$set-$m" --quiet
        timed "search $set $m" "$WORK/run-$set-$m.trec" search "$WORK/idx-$set-$m" "$DATA/$set" --hits 100 \
            "${extra[@]}" -o "$WORK/run-$set-$m.trec" --quiet
        runs+=("$WORK/run-$set-$m.trec")
    done
    "$PY" -m retrctl eval "${runs[@]}" --qrels "$DATA/$set" -m nDCG@10 -m R@100
done

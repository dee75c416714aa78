#!/usr/bin/env bash
# Benchmark: pruned retrievers healed by distillation from their unpruned selves, at full size on a GPU: every step
# a `retrctl` command as the README runs it, on all of a BEIR set (SciFact: 5,183 docs, 300 test queries).
#
# 1. SmolLM2 (first: the part only a GPU makes affordable): the teacher is a SmolLM2 retriever trained here (DATA's
#    train queries, judged positive and one BM25-mined negative: bench/heal_encoder.py's groups; mean pooling,
#    bidirectional, 3 epochs of 32 at lr 1e-4, 256 tokens, bench/light.py's instruction as the query prompt), cut
#    with `prune --drop-layers SMOL_DROP` (15 of 30 blocks: 2.0-2.3x encode speed on the CPU, bench/RESULTS.md) and
#    healed by `train --corpus DATA --teacher TRAINED`: once per line of SMOL_HEALS ("NAME FLAGS...", default
#    "smol-healed" with the command's defaults), the heals side by side on the one GPU (each needs ~16 GB), then
#    their indexes likewise.
# 2. MiniLM: `prune MINILM --drop-layers 3 --calibration DATA`, then `train --corpus DATA --model small --teacher
#    MINILM` with the defaults (two passes, lr 3e-4) and with `--epochs 3`.
# 3. `index` / `search --hits 100` / `eval` of every model; eval's paired t-test against each family's teacher
#    (the table to stdout and WORK/eval-FAMILY.txt, its JSON lines with the p values to WORK/eval-FAMILY.json).
#
#    MINILM=dir SMOLLM2=file.gguf DATA=../shared/data/scifact WORK=/tmp/heal-gpu bash bench/heal_gpu.sh
#
# FAMILIES="smollm2" runs one family. TEACHER_FLAGS adds flags to the SmolLM2 teacher's training (--dtype bf16, say).
# SMOKE="--max-steps 2" caps every training run (a smoke test on tiny models).
# Each command's seconds go to WORK/times.tsv (commands side by side share the GPU: their seconds are upper
# bounds); logs to stderr.
set -euo pipefail

DATA=${DATA:-../shared/data/scifact}
WORK=${WORK:-bench/work/heal-gpu}
MINILM=${MINILM:-minilm}
SMOLLM2=${SMOLLM2:-smollm2}
MINILM_DROP=${MINILM_DROP:-3}
SMOL_DROP=${SMOL_DROP:-15}
SMOL_HEALS=${SMOL_HEALS:-smol-healed}
FAMILIES=${FAMILIES:-smollm2 minilm}
SMOKE=${SMOKE:-}
TEACHER_FLAGS=${TEACHER_FLAGS:-}
PY=${PY:-python3}
PROMPT=$'Instruct: Given a scientific claim, retrieve documents that support or refute the claim\nQuery: '
mkdir -p "$WORK"

timed() {  # timed NAME retrctl-args...: runs the command, appends "NAME<TAB>seconds" to WORK/times.tsv
    local name=$1 start=$SECONDS
    shift
    echo "== $name: retrctl $*" >&2
    "$PY" -m retrctl "$@"
    printf '%s\t%s\n' "$name" $((SECONDS - start)) >>"$WORK/times.tsv"
}

evaluate() {  # evaluate NAME MODEL: index DATA with MODEL, search its test queries
    timed "index $1" index "$DATA" --model "$2" -o "$WORK/idx-$1" --quiet
    timed "search $1" search "$WORK/idx-$1" "$DATA" --hits 100 -o "$WORK/$1.trec" --quiet
}

pids=()
side_by_side() {  # side_by_side CMD ARGS...: CMD in the background; wait_all then fails if any of them failed
    "$@" &
    pids+=($!)
}

wait_all() {
    local pid failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    pids=()
    return $failed
}

score() {  # score FAMILY RUN...: eval's paired table against the first run, and its JSON lines (the p values)
    local family=$1
    shift
    "$PY" -m retrctl eval "$@" --qrels "$DATA" -m nDCG@10 -m R@100 | tee "$WORK/eval-$family.txt"
    "$PY" -m retrctl eval "$@" --qrels "$DATA" -m nDCG@10 -m R@100 --json --quiet >"$WORK/eval-$family.json"
}

has() { [[ " $FAMILIES " == *" $1 "* ]]; }

# SmolLM2: a trained retriever as the teacher, cut to half its blocks, healed from it
if has smollm2; then
    TRAIN_GROUPS=$("$PY" - "$(dirname "$0")" "$DATA" "$WORK" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from heal_encoder import train_groups
print(train_groups(Path(sys.argv[2]), Path(sys.argv[3]), None))
EOF
    )
    timed "train smollm2" train "$TRAIN_GROUPS" --corpus "$DATA" --model "$SMOLLM2" --pooling mean --bidirectional \
        --query-prompt "$PROMPT" --passage-max-len 256 --query-max-len 64 --epochs 3 --train-batch-size 32 \
        --train-group-size 2 --lr 1e-4 $TEACHER_FLAGS $SMOKE -o "$WORK/smol-trained"
    timed "prune smollm2" prune "$WORK/smol-trained" --drop-layers "$SMOL_DROP" --calibration "$DATA" \
        -o "$WORK/smol-drop"
    healed=()
    while read -r name flags; do
        [ -n "$name" ] || continue
        # $flags and $SMOKE are split into words on purpose
        side_by_side timed "heal $name" train --corpus "$DATA" --model "$WORK/smol-drop" \
            --teacher "$WORK/smol-trained" $flags $SMOKE -o "$WORK/$name"
        healed+=("$name")
    done <<<"$SMOL_HEALS"
    wait_all
    runs=()
    for m in smol-trained smol-drop "${healed[@]}"; do
        side_by_side evaluate "$m" "$WORK/$m"
        runs+=("$WORK/$m.trec")
    done
    wait_all
    score smollm2 "${runs[@]}"
fi

# MiniLM: cut, healed with the defaults and with three passes
if has minilm; then
    timed "prune minilm" prune "$MINILM" --drop-layers "$MINILM_DROP" --calibration "$DATA" -o "$WORK/minilm-drop"
    timed "heal minilm" train --corpus "$DATA" --model "$WORK/minilm-drop" --teacher "$MINILM" $SMOKE \
        -o "$WORK/minilm-healed"
    timed "heal minilm 3 epochs" train --corpus "$DATA" --model "$WORK/minilm-drop" --teacher "$MINILM" \
        --epochs 3 $SMOKE -o "$WORK/minilm-healed-e3"
    for m in minilm minilm-drop minilm-healed minilm-healed-e3; do
        evaluate "$m" "$([ $m = minilm ] && echo "$MINILM" || echo "$WORK/$m")"
    done
    score minilm "$WORK/minilm.trec" "$WORK/minilm-drop.trec" "$WORK/minilm-healed.trec" \
        "$WORK/minilm-healed-e3.trec"
fi
column -t -s $'\t' "$WORK/times.tsv" 2>/dev/null || cat "$WORK/times.tsv"

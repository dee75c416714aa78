"""crop: pseudo-queries cut from the document itself, with the document as the known positive.

Method: sentence cropping as in DRAMA (Ma et al. 2025, "DRAMA: Diverse Augmentation from Large Language Models
to Smaller Dense Retrievers", arXiv:2502.18460, §3.1: a random sentence of a document is a query for it) and
DRAGON (Lin et al. 2023, arXiv:2302.07452, "sentence cropping" augmentation); `--unit span` is Contriever's
independent cropping (Izacard et al. 2021, arXiv:2112.09118, §3.2: a random contiguous span of the text).

| paper knob                                  | flag                      | default |
|---------------------------------------------|---------------------------|---------|
| crop = one sentence (DRAMA/DRAGON) or span   | `--unit sentence|span`    | sentence|
| crops per document                           | `--per-doc`               | 1       |
| span length bounds (Contriever: ratio of doc)| `--min-words/--max-words`| 4 / 64  |
| randomness                                   | `--seed`                  | 0       |
| a fixed sample of N documents (not in the papers) | `--sample N`         | all     |

Sentences are found with language-agnostic rules on Unicode properties (UAX #29 sentence-break classes via the
`regex` module), not per-language models: a run of STerm/ATerm characters (. ! ? 。 ！ ？ । ॥ ؟ ။ …) plus closing
quotes/brackets ends a sentence; ASCII terminators need following whitespace, and a '.' followed by a lowercase
letter or preceded by a one-letter word ("J. Smith", "U.S.") does not end one; non-ASCII terminators (CJK,
Devanagari, Arabic, Myanmar) end a sentence even without a space; line breaks always do. Thai, Lao, Khmer and
Myanmar write no spaces between words and Thai has no sentence punctuation: an over-long segment in those scripts
is split at its spaces (which separate clauses there) and short clauses are merged back up to the length bounds.

Length is counted in "words" that work across scripts: a whitespace-separated token; one Han/kana character
(as BERT's basic tokenizer does); or up to 4 graphemes of a no-space script (about one Thai word). Tokens
with no letter or digit (punctuation) do not count. A sentence longer than `--max-words` is cut to a random
window of that many words, preferring cuts at spaces and punctuation; such queries carry `truncated: true` and
are counted on stderr (silent truncation is a peer bug, ST#4060).

Output: query records `{query_id, query_text, source_docid, start, end, truncated}`; `start`/`end` are character
offsets into the doc's `text` (text[start:end] == query_text), so hits on crops can be collapsed back to
documents (ColBERT#59). query_id is `<docid>#crop<i>`.

Sample: `--sample N` crops only the N documents (of this shard, after `--shard-id/--shard-num`) with the smallest
stable hash of (seed, docid) (retrctl.hashing.sample): the same N in any input order, and a larger N keeps every
document a smaller one took; `--shard-id 0 --shard-num 10 --sample 50` is 50 documents of shard 0.

Determinism: each document's random generator is seeded from (seed, docid), so the output for a document does not
depend on which other documents are in the run: `--shard-id/--shard-num` runs concatenated and sorted equal one
run sorted, and the same seed and input give byte-identical output.

Deviations: Contriever samples span length as a ratio (10-50%) of the document; we sample a word count in
[min_words, max_words] so queries stay query-sized for long documents. Titles are not cropped (only `text`).
"""

from __future__ import annotations

import click

from retrctl.crops import _rng, crop, segments, sentences, units
from retrctl.errors import UsageError
from retrctl.options import options, renamed
from retrctl.stage import stage

__all__ = ["_rng", "command", "crop", "segments", "sentences", "units"]  # the cutting lives in retrctl/crops.py


@stage(crop, reads="doc", writes="query")
@options("seed", "per_doc", "sample")
@click.option("--unit", type=click.Choice(["sentence", "span"]), help="sentence (DRAMA/DRAGON) or span (Contriever).")
@options("query_words")
@renamed("--max-tokens", "--max-words", type=click.IntRange(min=1))  # it counts words
def command(docs, **opts):
    """Sentence-crop pseudo-queries (DRAMA / DRAGON / Contriever): one query per crop, its doc the positive."""
    opts = {k: v for k, v in opts.items() if v is not None}
    defaults = crop.__kwdefaults__
    if opts.get("max_words", defaults["max_words"]) < opts.get("min_words", defaults["min_words"]):
        raise UsageError("must be >= --min-words", flag="--max-words")
    return crop(docs, **opts)

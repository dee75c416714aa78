"""Pseudo-queries cut from a document: sentence crops (DRAMA, DRAGON) and Contriever's independent spans.

The method and its rules are described in stages/crop.py (``retrctl crop``); this module holds the cutting itself
so that any stage (crop; train's distillation from a corpus alone) cuts the same crops from the same seed.
Sentences are found with language-agnostic rules on Unicode properties; lengths are counted in word-like units
that work across scripts (a whitespace token, one Han/kana character, or up to 4 graphemes of a no-space script).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterable, Iterator

import regex

from retrctl import hashing
from retrctl.hashing import stable_rng

log = logging.getLogger("retrctl.crop")

_TERM = r"\p{SB=STerm}\p{SB=ATerm}"
_IDEO = r"\p{Han}\p{Hiragana}\p{Katakana}"
_NOSPACE = r"\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}"
# a terminator run with its closing quotes/brackets, then what follows it (whitespace, end, or more text)
_SENT_END = regex.compile(rf"[{_TERM}]+\p{{SB=Close}}*|\n")
_UNIT = regex.compile(rf"[{_IDEO}]|(?:(?=[{_NOSPACE}])\X){{1,4}}|[^\s{_IDEO}{_NOSPACE}]+")
_WORDLIKE = regex.compile(r"[\p{L}\p{N}]")
_UNSPACED = regex.compile(rf"[{_IDEO}{_NOSPACE}]")
_TOKEN = re.compile(r"\S+")  # str.split()'s tokens
_CHAR_UNIT = regex.compile(rf"[{_IDEO}{_NOSPACE}]|[^\s{_IDEO}{_NOSPACE}]+")
_NOSPACE_CHAR = regex.compile(rf"[{_NOSPACE}]")
NOSPACE_WORD = 4  # grapheme clusters of Thai and the like that make one word (``_UNIT``)
_STRIP = " \t\r\n\f\v\u00a0\u200b\u200c\u200d\u2060\ufeff\u3000"


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and (text[start] in _STRIP or text[start].isspace()):
        start += 1
    while end > start and (text[end - 1] in _STRIP or text[end - 1].isspace()):
        end -= 1
    return start, end


def _one_letter_word(text: str, i: int) -> bool:
    """A single letter before the '.' at i: initials and dotted abbreviations (J. Smith, U.S. Army)."""
    return i >= 1 and text[i - 1].isalpha() and (i < 2 or not text[i - 2].isalpha())


def sentences(text: str) -> list[tuple[int, int]]:
    """Sentence spans (start, end) of ``text``, trimmed of whitespace and BOMs; language-agnostic rules."""
    spans, start = [], 0
    for m in _SENT_END.finditer(text):
        end, run = m.end(), m.group()
        if run != "\n":
            nxt = text[end : end + 1]
            ascii_only = all(c in ".!?\"')]" for c in run)
            if ascii_only:
                if nxt and not nxt.isspace():
                    continue  # 3.5, e.g.x, "a.b"
                if run.rstrip("\"')]").endswith(".") and not run.startswith(("!", "?")):
                    after = text[end:].lstrip()
                    if after[:1].islower() or _one_letter_word(text, m.start()):
                        continue  # "etc. and", "J. Smith", "U.S. Army"
        s, e = _trim(text, start, end)
        if e > s:
            spans.append((s, e))
        start = end
    s, e = _trim(text, start, len(text))
    if e > s:
        spans.append((s, e))
    return spans


def units(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Word-like units (start, end) in text[start:end]; punctuation-only tokens are not units."""
    end = len(text) if end is None else end
    return [(m.start(), m.end()) for m in _UNIT.finditer(text, start, end) if _WORDLIKE.search(m.group())]


def word_spans(text: str) -> list[tuple[int, int]]:
    """Words as lengths are counted outside crops (qgen's prompt cut and query lengths): whitespace tokens, and a
    token holding ideographs or a no-space script counted by its ``units``. On text in spaced scripts these are
    exactly ``text.split()``'s tokens; a Chinese sentence is as many words as it has characters, not one."""
    out = []
    for m in _TOKEN.finditer(text):
        out.extend(units(text, m.start(), m.end()) if _UNSPACED.search(m.group()) else [m.span()])
    return out


def char_units(text: str) -> list[tuple[str, float]]:
    """``text``'s whitespace tokens, a token holding a script written without spaces split into its characters (and
    runs of the others), each with its share of a word as ``word_spans`` counts words: 1, or 1/NOSPACE_WORD for a
    character of Thai and the like. On text in spaced scripts: ``text.split()``'s tokens, 1 each. What qgen's copy
    checks compare: a run copied from the middle of an unspaced sentence is found in it character by character."""
    out = []
    for token in text.split():
        if not _UNSPACED.search(token):
            out.append((token, 1.0))
            continue
        out.extend((u, 1 / NOSPACE_WORD if _NOSPACE_CHAR.fullmatch(u) else 1.0) for u in _CHAR_UNIT.findall(token))
    return out


def count_words(text: str) -> int:
    return len(word_spans(text))


def cut_words(text: str, max_words: int) -> tuple[str, bool]:
    """``text`` cut after its ``max_words``-th word (``word_spans``), whitespace runs made single spaces; whether it
    was cut. On text in spaced scripts: ``" ".join(text.split()[:max_words])``."""
    spans = word_spans(text)
    if len(spans) <= max_words:
        return " ".join(text.split()), False
    return (" ".join(text[:spans[max_words - 1][1]].split()) if max_words > 0 else ""), True


def _nospace_script(text: str, start: int, end: int) -> bool:
    letters = regex.findall(r"\p{L}", text[start:end])
    return bool(letters) and sum(bool(regex.match(rf"[{_NOSPACE}]", c)) for c in letters) * 2 > len(letters)


def _clauses(text: str, start: int, end: int, min_words: int, max_words: int) -> list[tuple[int, int]]:
    """Split a no-space-script segment at its spaces (Thai puts them between phrases and sentences) and merge
    the pieces greedily into clauses of about max_words/4 words (a sentence-sized query), never over max_words."""
    target = max(min_words, max_words // 4)
    pieces = [(start + m.start(), start + m.end()) for m in regex.finditer(r"\S+", text[start:end])]
    out: list[list[int]] = []
    for s, e in pieces:
        n = len(units(text, s, e))
        if out and (out[-1][2] < target or n < min_words) and out[-1][2] + n <= max_words:
            out[-1][1], out[-1][2] = e, out[-1][2] + n
        else:
            out.append([s, e, n])
    return [(s, e) for s, e, _ in out]


def segments(text: str, min_words: int, max_words: int) -> list[tuple[int, int]]:
    """Sentences, with over-long no-space-script segments (Thai) split at spaces into clauses."""
    out = []
    for s, e in sentences(text):
        if len(units(text, s, e)) > max_words and _nospace_script(text, s, e):
            out.extend(_clauses(text, s, e, min_words, max_words))
        else:
            out.append((s, e))
    return out


def _boundary_after(text: str, pos: int, limit: int) -> bool:
    return pos >= limit or text[pos].isspace() or bool(regex.match(r"\p{P}", text[pos]))


def _window(text: str, us: list[tuple[int, int]], seg_end: int, min_words: int, max_words: int, rng) -> tuple[int, int]:
    """A random window of max_words units, preferring starts/ends at spaces or punctuation."""
    n = len(us)
    last = n - max_words
    starts = [i for i in range(last + 1) if i == 0 or _boundary_after(text, us[i][0] - 1, seg_end)]
    i = rng.choice(starts) if starts else rng.randint(0, last)
    j = i + max_words - 1
    for k in range(j, i + min_words - 2, -1):  # end at a boundary if one keeps >= min_words units
        if _boundary_after(text, us[k][1], seg_end):
            j = k
            break
    return us[i][0], us[j][1]


def _rng(seed: int, docid: str) -> random.Random:
    return stable_rng(seed, docid)


def crop(docs: Iterable[dict], *, per_doc: int = 1, unit: str = "sentence", min_words: int = 4, max_words: int = 64,
         seed: int = 0, sample: int | None = None) -> Iterator[dict]:
    """Yield query records (query_id, query_text, source_docid, start, end, truncated) cut from doc records;
    ``sample``: only from the ``sample`` docs with the smallest stable hash of (seed, docid) (hashing.sample)."""
    if per_doc < 1 or min_words < 1 or max_words < min_words:
        raise ValueError("need per_doc >= 1 and 1 <= min_words <= max_words")
    if unit not in ("sentence", "span"):
        raise ValueError(f"unit must be 'sentence' or 'span', got {unit!r}")
    if sample is not None:
        docs = hashing.sample(docs, sample, seed, "docid")
    stats = {"docs": 0, "queries": 0, "skipped": 0, "fewer": 0, "truncated": 0}
    for doc in docs:
        stats["docs"] += 1
        text, rng = doc["text"], _rng(seed, doc["docid"])
        spans = _sentence_crops(text, per_doc, min_words, max_words, rng) if unit == "sentence" else \
            _span_crops(text, per_doc, min_words, max_words, rng)
        if not spans:
            stats["skipped"] += 1
            continue
        stats["fewer"] += len(spans) < per_doc
        for i, (s, e, cut) in enumerate(spans):
            stats["queries"] += 1
            stats["truncated"] += cut
            yield {"query_id": f"{doc['docid']}#crop{i}", "query_text": text[s:e], "source_docid": doc["docid"],
                   "start": s, "end": e, "truncated": cut}
    log.info("%d docs -> %d queries; %d docs skipped (no %s of >= %d words); %d docs gave fewer than %d; "
             "%d crops cut to %d words", stats["docs"], stats["queries"], stats["skipped"], unit, min_words,
             stats["fewer"], per_doc, stats["truncated"], max_words)


def _sentence_crops(text, per_doc, min_words, max_words, rng) -> list[tuple[int, int, bool]]:
    cands = []
    for s, e in segments(text, min_words, max_words):
        us = units(text, s, e)
        if len(us) >= min_words:
            cands.append((s, e, us))
    picked = sorted(rng.sample(range(len(cands)), min(per_doc, len(cands))))
    out = []
    for k in picked:
        s, e, us = cands[k]
        if len(us) > max_words:
            out.append((*_window(text, us, e, min_words, max_words, rng), True))
        else:
            out.append((s, e, False))
    return out


def _span_crops(text, per_doc, min_words, max_words, rng) -> list[tuple[int, int, bool]]:
    us = units(text)
    if len(us) < min_words:
        return []
    seen, out = set(), []
    for _ in range(per_doc * 4):  # a few retries so short docs do not repeat a span
        length = rng.randint(min_words, min(max_words, len(us)))
        i = rng.randint(0, len(us) - length)
        span = (us[i][0], us[i + length - 1][1])
        if span not in seen:
            seen.add(span)
            out.append((*span, False))
        if len(out) == per_doc:
            break
    return sorted(out)

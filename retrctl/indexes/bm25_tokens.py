"""How BM25 splits a lower-cased text into tokens (``--bm25-tokens``).

- ``words``: bm25s's own splitter, runs of two or more ``\\w`` characters (Python's ``re``). Scripts written without
  spaces become one token per clause (XQuAD's Chinese: BM25 nDCG@10 0.12), and Brahmic words break at their
  vowel signs, which ``\\w`` does not match (Hindi 0.74): what every index built before ``--bm25-tokens`` holds.
- ``multilingual``: the same words, with the vowel signs and other combining marks of the Brahmic scripts
  (Devanagari to Sinhala) kept inside their words, and every run of a script written without spaces (Chinese,
  Japanese, Korean, Thai, Lao, Myanmar, Khmer) split into its characters and the pairs of neighbours, as Lucene's
  CJK analyzer indexes bigrams; a character there carries its own combining marks (Thai's vowels and tones).
  Text in other scripts gets exactly the tokens of ``words``.

Plain ``re`` with the scripts' code-point ranges (the combining marks listed from ``unicodedata`` once); a text
holding none of these characters is split by ``words`` after one scan for them.
"""

from __future__ import annotations

import re
import unicodedata

TOKENS = ("words", "multilingual")
WORDS = re.compile(r"(?u)\b\w\w+\b").findall  # bm25s.tokenization.Tokenizer's default splitter

# scripts written without spaces between words
UNSPACED = ("\u0e00-\u0eff"  # Thai, Lao
            "\u1000-\u109f"  # Myanmar
            "\u1100-\u11ff"  # Hangul Jamo
            "\u1780-\u17ff"  # Khmer
            "\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3038-\u303b"  # CJK radicals, ideographic marks and numerals
            "\u3040-\u30ff\u31f0-\u31ff"  # Hiragana, Katakana
            "\u3130-\u318f"  # Hangul compatibility Jamo
            "\u3400-\u4dbf\u4e00-\u9fff"  # CJK ideographs
            "\ua960-\ua97f\uac00-\ud7ff"  # Hangul
            "\uf900-\ufaff\uff66-\uff9f"  # CJK compatibility ideographs, half-width Katakana
            "\U00020000-\U0003134f")  # CJK ideographs, extensions B to G


def _marks(ranges: list[tuple[int, int]]) -> str:
    return "".join(re.escape(chr(c)) for lo, hi in ranges for c in range(lo, hi + 1)
                   if unicodedata.category(chr(c)) in ("Mn", "Mc"))


BRAHMIC_MARKS = _marks([(0x0900, 0x0DFF)])  # Devanagari, Bengali, Gurmukhi, Gujarati, Oriya, Tamil, Telugu, Kannada,
# Malayalam, Sinhala
UNSPACED_MARKS = _marks([(0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x3099, 0x309A)])
_WORD_CHAR = rf"(?:[^\W{UNSPACED}]|[{BRAHMIC_MARKS}])"
MULTILINGUAL_WORDS = re.compile(rf"{_WORD_CHAR}{{2,}}").findall
UNSPACED_RUN = re.compile(rf"(?:[{UNSPACED}](?<![{UNSPACED_MARKS}])[{UNSPACED_MARKS}]*)+")
UNSPACED_CHAR = re.compile(rf"[{UNSPACED}](?<![{UNSPACED_MARKS}])[{UNSPACED_MARKS}]*").findall
SPLIT_OTHERWISE = rf"[{UNSPACED}{BRAHMIC_MARKS}]"  # a character the two modes split differently
_SPLIT_OTHERWISE = re.compile(SPLIT_OTHERWISE).search


def multilingual(text: str) -> list[str]:
    """``text``'s tokens in ``multilingual`` mode, in reading order."""
    if not _SPLIT_OTHERWISE(text):  # most text: bm25s's own split, at its cost
        return WORDS(text)
    out, start = [], 0
    for run in UNSPACED_RUN.finditer(text):
        out += MULTILINGUAL_WORDS(text[start:run.start()])
        chars = UNSPACED_CHAR(run.group())
        out += chars + [a + b for a, b in zip(chars, chars[1:], strict=False)]
        start = run.end()
    out += MULTILINGUAL_WORDS(text[start:])
    return out


def splitter(tokens: str):
    """The function from a lower-cased text to its tokens."""
    if tokens not in TOKENS:
        raise ValueError(f"BM25 tokens must be one of {', '.join(TOKENS)}, got {tokens!r}")
    return WORDS if tokens == "words" else multilingual

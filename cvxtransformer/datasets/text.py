"""Real English text that ships offline: sentences of the Python documentation.

The standard library's ``pydoc_data.topics`` holds the text of the Python language reference
topics that ``help()`` shows (written by the Python documentation authors, PSF licence). This
module cuts it into clean sentences: prose paragraphs only (indented code, grammar rules and
``>>>`` sessions are dropped), line wraps joined, reStructuredText markup (``*x*``, ``"x"``
quotes kept) removed, then split after ``.``, ``?`` or ``!`` followed by a capital letter.
A sentence is kept when it ends with a full stop, starts with a capital letter, holds only
letters, digits, spaces and ordinary punctuation, and has ``min_words`` to ``max_words`` words.

The list depends only on the Python version's documentation; the choice among it only on ``seed``.
"""
import re

import numpy as np

from ..core.errors import invalid
from ..core.validation import check_int

_ALLOWED = re.compile(r"^[A-Z][A-Za-z0-9 ,;:'()\-.?!\"]*[.]$")
_SPLIT = re.compile(r"(?<=[.?!])\s+(?=[\"A-Z])")


def _prose_paragraphs(text):
    for para in re.split(r"\n\s*\n", text):
        lines = para.split("\n")
        if any(line.startswith((" ", "\t")) for line in lines if line.strip()):
            continue                       # code, grammar and indented examples
        if any(s in para for s in ("::=", ">>>", "***", "===", "---", "|")):
            continue
        yield " ".join(line.strip() for line in lines if line.strip())


def _clean(sentence):
    sentence = re.sub(r"\*+([^*]+)\*+", r"\1", sentence)          # *emphasis*, **strong**
    return re.sub(r"\s+", " ", sentence).strip()


def all_sentences(min_words=8, max_words=40):
    """Every clean sentence of ``pydoc_data.topics`` with ``min_words`` to ``max_words`` words,
    in the order of the topics (sorted by name) and of the text; duplicates removed.

    >>> s = all_sentences()
    >>> len(s) > 500, all(8 <= len(x.split()) <= 40 for x in s)
    (True, True)
    """
    from pydoc_data.topics import topics

    min_words = check_int("min_words", min_words, 1)
    max_words = check_int("max_words", max_words, min_words)
    seen, out = set(), []
    for key in sorted(topics):
        for para in _prose_paragraphs(topics[key]):
            for sentence in _SPLIT.split(para):
                sentence = _clean(sentence)
                if sentence in seen or not _ALLOWED.match(sentence) or sentence.endswith("e.g.") \
                        or not min_words <= len(sentence.split()) <= max_words:
                    continue
                seen.add(sentence)
                out.append(sentence)
    return out


def english_sentences(n, min_words=8, max_words=40, seed=0):
    """``n`` real English sentences (a list of str), drawn without replacement from
    :func:`all_sentences` by a generator seeded with ``seed``: deterministic, no download.

    >>> english_sentences(2, seed=0) == english_sentences(2, seed=0)
    True
    >>> len(english_sentences(3, min_words=5, max_words=12))
    3
    """
    n = check_int("n", n, 1)
    seed = check_int("seed", seed, 0)
    pool = all_sentences(min_words, max_words)
    if n > len(pool):
        raise invalid("n", f"at most {len(pool)} (the sentences with {min_words} to {max_words} words)",
                      repr(n), "ask for fewer sentences or widen min_words/max_words")
    pick = np.random.default_rng(seed).choice(len(pool), size=n, replace=False)
    return [pool[i] for i in pick]

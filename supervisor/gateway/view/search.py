"""Ranking tools for a query: BM25 over a tool's name and description. Pure, deterministic.

An :class:`Index` is built once per catalog (per view) and answers any number of queries: the
postings are computed up front, so a query costs only the documents that share a term with it
(well under a millisecond for 1,000 tools). Names are split on ``__``, ``_``, ``-``, digits and
camelCase, so ``github__createPullRequest`` is found by "create pull request". A light suffix
stemmer makes "files", "deleting" and "deleted" meet "file" and "delete". Ties rank by name, so
the same catalog and query always give the same order.

Why not a library: ``rank_bm25`` scores every document on every query and is unmaintained since
2022; ``bm25s`` needs numpy and scipy for what is a hundred lines here. The corpus is a few
thousand short texts at most.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ("NAME_WEIGHT", "Index", "stem", "tokenize")

K1 = 1.2  # term-frequency saturation
B = 0.75  # length normalisation
NAME_WEIGHT = 3  # a term in the name counts as this many in the description (BM25F style)
_ALNUM = re.compile(r"[A-Za-z0-9]+")
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_STOP_WORDS = (
    "a an and are as at be by for from has have how i in into is it its me my of on or our so "
    "that the their them then there these this those to us was we what when where which who will "
    "with you your can do does please want need some any"
)
_STOP = frozenset(_STOP_WORDS.split())
# How people ask for the usual actions, and the verb tool names use for them. Query side only.
_ACTIONS = {
    "create": "add new make open insert file post schedule start write register",
    "delete": "remove erase drop destroy clean purge cancel",
    "get": "show fetch read view display detail inspect",
    "list": "all enumerate",
    "search": "find lookup look query",
    "update": "edit modify change set rename patch",
}
_SYNONYM_WEIGHT = 0.5  # an expanded action counts half as much as a word the user wrote
_DOUBLE = re.compile(r"([b-df-hj-np-tv-z])\1$")  # "stopp" -> "stop"; not "ll", "ss", "zz"


@functools.lru_cache(maxsize=8192)  # a catalog's vocabulary is a few thousand words; bounded anyway
def stem(word: str) -> str:
    """A light suffix stemmer: plurals, -ing, -ed, a final -e. Pure; same word, same stem."""
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    if _DOUBLE.search(word) and not word.endswith(("ll", "ss", "zz")):
        word = word[:-1]
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def _expansions() -> dict[str, str]:
    out: dict[str, str] = {}
    for verb, words in _ACTIONS.items():
        for word in words.split():
            out.setdefault(stem(word), stem(verb))
    return out


def tokenize(text: str) -> list[str]:
    """Lower-case stems of *text*'s words, camelCase and snake_case split, stop words dropped.

    A word with digits also counts whole (``s3``, ``ec2``, ``k8s``); single letters do not count.
    """
    out = []
    for word in _ALNUM.findall(text):
        parts = [p.lower() for p in _WORDS.findall(word)]
        out += [stem(p) for p in parts if p not in _STOP and (len(p) > 1 or p.isdigit())]
        if len(parts) > 1 and any(p.isdigit() for p in parts):
            out.append(word.lower())
    return out


_EXPANSIONS = _expansions()


class Index:
    """BM25 over ``(name, description)`` documents, in the order given.

    Args:
        documents: one ``(name, description)`` pair per tool; the description may carry any
            further text worth matching (parameter names, a title).
    """

    def __init__(self, documents: Iterable[tuple[str, str]]) -> None:
        self.names: list[str] = []
        lengths: list[int] = []
        postings: dict[str, list[tuple[int, int]]] = {}
        for position, (name, description) in enumerate(documents):
            self.names.append(name)
            counts: Counter[str] = Counter()
            for term in tokenize(name):
                counts[term] += NAME_WEIGHT
            counts.update(tokenize(description))
            lengths.append(sum(counts.values()))
            for term, frequency in counts.items():
                postings.setdefault(term, []).append((position, frequency))
        count = len(self.names)
        average = (sum(lengths) / count) if count else 1.0
        norms = [K1 * (1 - B + B * length / (average or 1.0)) for length in lengths]
        # Everything but the query is precomputed: idf times the saturated tf, per posting.
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for term, entries in postings.items():
            idf = math.log(1 + (count - len(entries) + 0.5) / (len(entries) + 0.5))
            self._postings[term] = [(doc, idf * f * (K1 + 1) / (f + norms[doc])) for doc, f in entries]

    def __len__(self) -> int:
        return len(self.names)

    def search(self, query: str, limit: int = 10) -> list[tuple[int, float]]:
        """The best *limit* documents for *query*: ``(position, score)``, best first, ties by name."""
        scores: dict[int, float] = {}
        terms = dict.fromkeys(tokenize(query), 1.0)  # each query term once, in order
        for term in list(terms):
            action = _EXPANSIONS.get(term)
            if action is not None and action not in terms:
                terms[action] = _SYNONYM_WEIGHT
        for term, factor in terms.items():
            for doc, weight in self._postings.get(term, ()):
                scores[doc] = scores.get(doc, 0.0) + factor * weight
        names = self.names
        best = heapq.nsmallest(limit, scores.items(), key=lambda item: (-item[1], names[item[0]]))
        return [(doc, round(score, 6)) for doc, score in best]

    def terms(self) -> Sequence[str]:
        """The indexed terms (for tests and diagnostics)."""
        return sorted(self._postings)

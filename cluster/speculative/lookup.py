"""Drafts copied from text the answer is likely to repeat: the prompt and the output so far
(prompt lookup), or the text a client predicts (OpenAI's Predicted Outputs).

Pure Python over token ids, deterministic: every rank proposes the same drafts from the same
tokens, so no rank has to send them."""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 4  # the longest tail matched: longer matches are likelier to go on alike
MIN_NGRAM = 2  # the shortest indexed (a client's prediction is followed from 2)
LOOKUP_NGRAM = 3  # the shortest tail prompt lookup copies after: 2 repeat by chance in prose


class NgramIndex:
    """Where each n-gram of a growing token list last ended, for n in MIN_NGRAM..MAX_NGRAM."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = list(tokens)
        self._last_end: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # the n-grams ending before this position are indexed

    def _index_upto(self, end: int) -> None:
        toks = self.tokens
        for p in range(self._indexed, end):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, p + 1) + 1):
                self._last_end[tuple(toks[p + 1 - n : p + 1])] = p
        self._indexed = max(self._indexed, end)

    def after(self, tail: Sequence[int], before: int, shortest: int = MIN_NGRAM) -> int | None:
        """The position right after the latest occurrence of the longest matching end of
        `tail` (at least `shortest` tokens) among the n-grams that end before `before`; None
        when none matches."""
        self._index_upto(min(before, len(self.tokens)))
        for n in range(min(MAX_NGRAM, len(tail)), shortest - 1, -1):
            p = self._last_end.get(tuple(tail[len(tail) - n :]))
            if p is not None and p < before:
                return p + 1
        return None


class PromptLookup:
    """Drafts from the sequence itself (prompt and output so far): what followed the latest
    earlier occurrence of its last LOOKUP_NGRAM or more tokens."""

    def __init__(self) -> None:
        self.index = NgramIndex()

    def _catch_up(self, history: Sequence[int]) -> None:
        self.index.tokens.extend(history[len(self.index.tokens) :])

    def may_match(self, history: Sequence[int]) -> bool:
        """Whether a tail ending in the next token could match: its LOOKUP_NGRAM - 1 tokens
        before that one must have occurred before (known without the next token)."""
        self._catch_up(history)
        return self.index.after(history, len(history) - 1, LOOKUP_NGRAM - 1) is not None

    def propose(self, history: Sequence[int], pending: int, limit: int) -> list[int]:
        """Up to `limit` tokens to check after `pending`, the token fed next."""
        self._catch_up(history)
        tail = [*history[-(MAX_NGRAM - 1) :], pending]
        start = self.index.after(tail, len(history), LOOKUP_NGRAM)
        return [] if start is None else self.index.tokens[start : start + limit]


class Prediction:
    """A client's predicted answer: followed in step while the answer agrees with it, found
    again by n-gram when the answer departs from it."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.index = NgramIndex(tokens)
        self.at: int | None = 0  # where in the prediction the answer's next token should be
        self.answer: list[int] = []

    def propose(self, emitted: Sequence[int], limit: int) -> list[int]:
        """`emitted`: answer tokens added since the last call."""
        self.answer.extend(emitted)
        toks = self.index.tokens
        if self.at is not None:
            for t in emitted:
                if self.at < len(toks) and toks[self.at] == t:
                    self.at += 1
                else:
                    self.at = None
                    break
        if self.at is None:
            self.at = self.index.after(self.answer, len(toks))
        return [] if self.at is None else toks[self.at : self.at + limit]

"""Stop strings found in text that arrives a piece at a time, at a cost per character that does not grow
with the stop strings' length or the text's.

One Knuth-Morris-Pratt automaton per stop string ``s``: its state after the text t is the length of the
longest end of t that is a prefix of s, ``q(t) = max{k : t[len(t)-k:] == s[:k]}``. A character c moves it
by the prefix function ``fail[k-1]`` = length of the longest proper prefix of ``s[:k]`` that is also its
end: ``q <- fail[q-1]`` while ``s[q] != c``, then ``q + 1`` if ``s[q] == c``; amortised O(1) per character.
``q == len(s)`` is a match; the largest ``q`` below it over all stop strings is the text a request holds
back (it may yet become a stop string). Searching the kept tail instead cost O(len(s)^2) per token: a 64K
stop string slowed every request on the engine thread by seconds.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=32)  # the n completions of one prompt share their stop strings
def prefix_function(s: str) -> tuple[int, ...]:
    """``fail[i]`` = length of the longest proper prefix of ``s[:i+1]`` that is also its end."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return tuple(fail)


class StopStrings:
    """The stop strings of one request, fed the text as it is decoded.

    ``feed(new)`` returns where in the whole text the first stop string to appear starts, or None: of the
    stop strings that end inside ``new``, the one that ends first (the least start among those ending
    there), as if ``new`` had come a character at a time, so the cut does not depend on how the text was
    split into tokens (an earlier match would have ended the request);
    ``held`` is the length of the longest end of the text that is a proper prefix of a stop string.
    """

    def __init__(self, stops: list[str] | tuple[str, ...]):
        self.stops = [s for s in stops if s]
        self._fail = [prefix_function(s) for s in self.stops]
        self._state = [0] * len(self.stops)
        self._length = 0  # characters fed so far

    def feed(self, new: str) -> int | None:
        first = None  # (end, start) of the match that completes first
        for j, s in enumerate(self.stops):
            fail, q, n = self._fail[j], self._state[j], len(s)
            for i, c in enumerate(new):
                while q and s[q] != c:
                    q = fail[q - 1]
                if s[q] == c:
                    q += 1
                if q == n:  # s ends at new[i]
                    match = (i, self._length + i + 1 - n)
                    first = match if first is None else min(first, match)
                    q = fail[q - 1]
                    break  # this string's first match: the request ends here
            self._state[j] = q
        self._length += len(new)
        return None if first is None else first[1]

    @property
    def held(self) -> int:
        return max(self._state, default=0)

"""Stop strings over streamed text: what is safe to emit now, and where the output ends."""

from __future__ import annotations


class StopStringMatcher:
    """Watches a request's text deltas for stop strings, which may span any number of deltas.

    Text that could still be the start of a stop string is held back until the next delta settles it.
    When stop strings overlap, the output ends at the first one to be complete (the earliest end; of
    those ending at the same place, the longest), so the result does not depend on how the text was
    split into deltas.
    """

    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False) -> None:
        if any(not s for s in stop):
            raise ValueError("a stop string cannot be empty")
        self.stop = list(dict.fromkeys(stop))
        self.include_stop_str_in_output = include_stop_str_in_output
        self.matched: str | None = None
        self._held = ""

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Take the next text delta; return the text safe to emit now and the stop string that matched
        (None while none has; a matched one is never empty, so it also reads as a bool).

        After a match, the request is over: later deltas give ("", the stop string).
        """
        if not self.stop:
            return delta, None
        if self.matched is not None:
            return "", self.matched
        text = self._held + delta
        match = self._first_match(text)
        if match is not None:
            start, self.matched = match
            self._held = ""
            end = start + len(self.matched)
            return text[:end] if self.include_stop_str_in_output else text[:start], self.matched
        keep = self._longest_partial_suffix(text)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep], None

    def flush(self) -> str:
        """At the end of the request (no stop string matched): the text still held back."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        """Where the first stop string to be complete starts in `text`, and which one it is."""
        best: tuple[int, int, str] | None = None
        for s in self.stop:
            start = text.find(s)
            if start < 0:
                continue
            end = start + len(s)
            if best is None or end < best[1] or (end == best[1] and start < best[0]):
                best = (start, end, s)
        return None if best is None else (best[0], best[2])

    def _longest_partial_suffix(self, text: str) -> int:
        """Length of the longest end of `text` that is the beginning (but not the whole) of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

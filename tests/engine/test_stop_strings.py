"""StopStringMatcher: stop strings found across any split of the text, and nothing else changed."""

from __future__ import annotations

import itertools
import random

import pytest

from wick.engine.stop_strings import StopStringMatcher


def _run(stop: list[str], pieces: list[str], include: bool = False) -> tuple[list[str], str | None, str]:
    matcher = StopStringMatcher(stop, include_stop_str_in_output=include)
    emitted, matched = [], None
    for piece in pieces:
        text, matched = matcher.feed(piece)
        emitted.append(text)
        if matched:
            break
    return emitted, matched, "" if matched else matcher.flush()


def _splits(text: str, max_cuts: int = 3) -> list[list[str]]:
    """`text` cut at every combination of up to `max_cuts` positions."""
    out = []
    for n in range(max_cuts + 1):
        for cuts in itertools.combinations(range(1, len(text)), n):
            bounds = (0, *cuts, len(text))
            out.append([text[a:b] for a, b in itertools.pairwise(bounds)])
    return out


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_at_every_boundary(include: bool) -> None:
    text = "Hello there. STOP and more"
    for pieces in _splits(text, max_cuts=2):
        emitted, matched, rest = _run(["STOP"], pieces, include)
        assert matched == "STOP" and rest == ""
        assert "".join(emitted) == ("Hello there. STOP" if include else "Hello there. ")


def test_safe_text_is_emitted_at_once() -> None:
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("The result is 4") == ("The result is 4", None)
    assert matcher.feed(" </ans") == (" ", None)  # "</ans" could start the stop string
    assert matcher.feed("wer") == ("", None)
    assert matcher.feed("x> ok") == ("</answerx> ok", None)
    assert matcher.feed(" <") == (" ", None)
    assert matcher.flush() == "<"


def test_multiple_stop_strings_first_complete_wins() -> None:
    stop = ["\n\nUser:", "###", "END"]
    for pieces in _splits("answer ## #END\n\nUser: x", max_cuts=2):
        emitted, matched, _ = _run(stop, pieces)
        assert matched == "END" and "".join(emitted) == "answer ## #"
    emitted, matched, _ = _run(stop, ["a END b ###"], include=True)
    assert "".join(emitted) == "a END" and matched == "END"


def test_overlapping_stop_strings() -> None:
    # "abcd" and "bc" overlap: "bc" is complete first, whatever the split.
    for pieces in _splits("xxabcdyy", max_cuts=3):
        emitted, matched, _ = _run(["abcd", "bc"], pieces)
        assert matched == "bc" and "".join(emitted) == "xxa"
        emitted, _, _ = _run(["abcd", "bc"], pieces, include=True)
        assert "".join(emitted) == "xxabc"
    # Both end at the same place: the longer one is the match.
    for pieces in _splits("xxabcyy", max_cuts=2):
        assert "".join(_run(["bc", "abc"], pieces)[0]) == "xx"
    # A self-overlapping stop string whose first attempt fails.
    for pieces in _splits("aaab", max_cuts=3):
        assert "".join(_run(["aab"], pieces)[0]) == "a"
    # Prefixes of a stop string that do not lead to it are released.
    for pieces in _splits("<e<en<end<end>", max_cuts=3):
        emitted, matched, _ = _run(["<end>", "<stop>"], pieces, include=True)
        assert matched == "<end>" and "".join(emitted) == "<e<en<end<end>"


def test_no_match_leaves_text_unchanged() -> None:
    rng = random.Random(0)
    alphabet = "ab😀é \n<>/"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stop = ["<stop>", "a😀a😀b", "é\n\n"]
        stop = [s for s in stop if s not in text]
        pieces, at = [], 0
        while at < len(text):
            n = rng.randint(0, 4)
            pieces.append(text[at:at + n])
            at += n
        emitted, matched, rest = _run(stop, pieces)
        assert matched is None and "".join(emitted) + rest == text


def test_after_a_match_the_request_is_over() -> None:
    matcher = StopStringMatcher(["x"])
    assert matcher.feed("abxcd") == ("ab", "x")
    assert matcher.feed("more") == ("", "x")
    assert matcher.flush() == ""


def test_empty_stop_string_is_refused() -> None:
    with pytest.raises(ValueError):
        StopStringMatcher(["ok", ""])

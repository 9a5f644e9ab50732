"""StopStringMatcher: OpenAI stop semantics, whatever the chunking."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from dynamoctl.tokenizer import StopResult, StopStringMatcher


def run(
    stops: Sequence[str], chunks: Sequence[str], include_stop: bool = False
) -> tuple[str, bool]:
    """Everything sent for ``chunks`` (with the final flush), and whether it stopped."""
    matcher = StopStringMatcher(stops, include_stop=include_stop)
    sent = []
    for chunk in chunks:
        result = matcher.push(chunk)
        sent.append(result.text)
        if result.stopped:
            return "".join(sent), True
    return "".join(sent) + matcher.flush(), matcher.stopped


def reference(stops: Sequence[str], text: str, include_stop: bool = False) -> tuple[str, bool]:
    """The stop whose last character comes first (ties: the longer), over the whole text."""
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, False
    end, start, _ = min(hits)
    return text[: end if include_stop else start], True


def test_stop_split_across_chunks_is_never_emitted() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.push("answer #") == StopResult("answer ", False)
    assert matcher.held == "#"
    assert matcher.push("#") == StopResult("", False)
    assert matcher.push("#more") == StopResult("", True)
    assert matcher.matched == "###"
    assert matcher.push("ignored") == StopResult("", True)
    assert matcher.flush("ignored") == ""


def test_false_start_is_released() -> None:
    matcher = StopStringMatcher(["</end>"])
    assert matcher.push("a </e") == StopResult("a ", False)
    assert matcher.push("x") == StopResult("</ex", False)
    assert matcher.push("</") == StopResult("", False)
    assert matcher.flush() == "</"  # end of stream: the tail was not a stop after all
    assert not matcher.stopped


def test_flush_checks_the_last_text() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("abc ST") == StopResult("abc ", False)
    assert matcher.flush("OP tail") == ""
    assert matcher.matched == "STOP"


def test_earliest_completion_wins() -> None:
    # "b" completes before "xbc" does: a char-by-char stream stops there.
    assert run(["xbc", "b"], ["xbc"]) == ("x", True)
    # Same end: the longer stop (earlier start) wins.
    assert run(["b", "ab"], ["zab"]) == ("z", True)
    assert run(["ab"], ["zabq"], include_stop=True) == ("zab", True)


def test_without_stops_nothing_is_held() -> None:
    matcher = StopStringMatcher(["", ""])
    assert matcher.push("abc") == StopResult("abc", False)
    assert matcher.held == ""


text_chars = st.sampled_from("ab#\n中🙂")


@given(
    stops=st.lists(st.text(text_chars, min_size=1, max_size=4), max_size=4),
    text=st.text(text_chars, max_size=40),
    cuts=st.lists(st.integers(0, 40)),
    include_stop=st.booleans(),
)
def test_any_chunking_matches_the_whole_text(
    stops: list[str], text: str, cuts: list[int], include_stop: bool
) -> None:
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(text)), len(text)]
    chunks = [text[a:b] for a, b in pairwise(bounds)]
    assert run(stops, chunks, include_stop) == reference(stops, text, include_stop)

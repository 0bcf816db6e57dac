import pytest

from lp.decode.stopping import StopChecker


class CharTokenizer:
    """id -> one character: 'a' + id; id 0 decodes to a newline."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("\n" if i == 0 else chr(ord("a") + i) for i in ids)


def feed(checker, tokens):
    for i, t in enumerate(tokens):
        if checker.push(t):
            return i
    return None


def test_eos_ends_output_and_is_kept():
    c = StopChecker([9, 7], 100)
    assert feed(c, [1, 2, 7, 4]) == 2
    assert c.tokens == [1, 2, 7] and c.reason == "eos"


def test_max_new_tokens_exact():
    c = StopChecker([], 3)
    assert feed(c, [1, 2, 3, 4, 5]) == 2
    assert c.tokens == [1, 2, 3] and c.reason == "length"


def test_stop_string_across_token_boundaries_cuts_text():
    c = StopChecker([], 100, stop=["\ndef"], tokenizer=CharTokenizer())
    # "bc" then "\n" "d" "e" "f": the stop string spans four tokens
    assert feed(c, [1, 2, 0, 3, 4, 5, 6]) == 5
    assert c.reason == "stop"
    assert c.tokens == [1, 2, 0, 3, 4, 5]
    assert c.text == "bc"


def test_earliest_stop_string_wins():
    c = StopChecker([], 100, stop=["ef", "cd"], tokenizer=CharTokenizer())
    feed(c, [2, 3, 4, 5])           # "cdef": "cd" completes first
    assert c.text == "" and c.tokens == [2, 3]


def test_eos_beats_length_on_the_same_token():
    c = StopChecker([3], 3)
    feed(c, [1, 2, 3])
    assert c.reason == "eos"


def test_stop_strings_need_a_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        StopChecker([], 5, stop=["x"])


def test_push_after_end_raises():
    c = StopChecker([], 1)
    c.push(1)
    with pytest.raises(RuntimeError):
        c.push(2)

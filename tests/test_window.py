"""The Jacobi window against DESIGN.md's worked examples."""
import pytest

from lp.decode.window import JacobiWindow


def sizes(w: JacobiWindow):
    return [len(level) for level in w.levels]


def test_warmup_level_sizes_n4_w5():
    w = JacobiWindow.seeded(4, 5, list(range(100, 106)))
    assert sizes(w) == [6]
    w.advance([1, 2, 3, 4, 5, 6])            # outputs of the 6 level-0 cells
    assert sizes(w) == [5, 6]
    w.advance([7, 8, 9, 10, 11, 12])         # outputs of the 6 level-1 cells
    assert sizes(w) == [4, 5, 5]
    assert w.warm
    w.advance([20, 21, 22, 23, 24])          # steady state keeps its shape
    assert sizes(w) == [4, 5, 5]


@pytest.mark.parametrize("n,width", [(3, 1), (3, 4), (4, 1), (5, 2), (7, 15)])
def test_warmup_reaches_steady_shape(n, width):
    w = JacobiWindow.seeded(n, width, [0] * (width + n - 3))
    for _ in range(n - 2):
        assert not w.warm
        deepest = len(w.levels[-1])
        w.advance(list(range(deepest)))
    assert w.warm
    assert sizes(w) == [width - 1] + [width] * (n - 2)


def test_warmup_keeps_positions():
    """A cell moves to the column that keeps its logical position when p grows by one."""
    w = JacobiWindow.seeded(4, 5, [11, 12, 13, 14, 15, 16])   # level 0 = columns 1..6
    w.advance([22, 23, 24, 25, 26, 27])       # predictions at columns 1..6 -> positions p+2..p+7
    assert w.levels[0] == [12, 13, 14, 15, 16]               # b'_1.. = old b_2..
    assert w.levels[1] == [22, 23, 24, 25, 26, 27]           # u'_{1,0} at p'+1 = p+2
    w.advance([30, 31, 32, 33, 34, 35])       # level-1 predictions, columns 0..5
    assert w.levels == [[13, 14, 15, 16], [23, 24, 25, 26, 27], [31, 32, 33, 34, 35]]


def test_ngram_extraction_design_example():
    w = JacobiWindow(4, 5, [[11, 12, 13, 14], [21, 22, 23, 24, 25], [31, 32, 33, 34, 35]])
    grams = w.ngrams(10, [41, 42, 43, 44, 45])
    assert grams == [
        (10, (21, 31, 41)),
        (11, (22, 32, 42)),
        (12, (23, 33, 43)),
        (13, (24, 34, 44)),
        (14, (25, 35, 45)),
    ]


def test_steady_advance():
    w = JacobiWindow(4, 5, [[11, 12, 13, 14], [21, 22, 23, 24, 25], [31, 32, 33, 34, 35]])
    w.advance([41, 42, 43, 44, 45])
    assert w.levels == [[22, 23, 24, 25], [31, 32, 33, 34, 35], [41, 42, 43, 44, 45]]


def test_no_ngrams_before_warm():
    w = JacobiWindow.seeded(4, 5, [0] * 6)
    assert w.ngrams(1, [0] * 6) == []


def test_seed_size_checked():
    with pytest.raises(ValueError, match="needs 6 tokens"):
        JacobiWindow.seeded(4, 5, [0] * 5)

from lp.verify import verify_greedy


def test_no_candidates_emits_next_token():
    v = verify_greedy(5, [], [])
    assert v.emitted == [5] and v.hits == 0 and v.candidate == -1


def test_longest_prefix_wins_and_bonus_token():
    cands = [(5, 6, 9), (5, 6, 7), (4, 6, 7)]
    preds = [[6, 7, 8], [6, 7, 8], [6, 7, 8]]    # argmax after g1, g2, g3 of each candidate
    v = verify_greedy(5, cands, preds)
    assert v.candidate == 1 and v.hits == 3
    assert v.emitted == [5, 6, 7, 8]            # all 3 guesses match: the 4th token is free


def test_ties_go_to_lowest_index():
    cands = [(5, 1), (5, 2), (5, 3)]
    preds = [[9, 0], [2, 0], [3, 0]]
    v = verify_greedy(5, cands, preds)
    assert v.candidate == 1 and v.hits == 2 and v.emitted == [5, 2, 0]


def test_first_token_mismatch_is_no_hit():
    v = verify_greedy(5, [(6, 7)], [[7, 8]])
    assert v.hits == 0 and v.emitted == [5]


def test_partial_match():
    v = verify_greedy(1, [(1, 2, 3, 4)], [[2, 9, 4, 5]])
    assert v.hits == 2 and v.emitted == [1, 2, 9]

import torch

from lp.decode.verify import HEADER, decide, greedy_hits, greedy_verdict, pack_payload

T = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731


def test_hits_per_candidate():
    guesses = T([[5, 6, 9], [5, 6, 7], [4, 6, 7], [5, 1, 7]])
    preds = T([[6, 7, 8], [6, 7, 8], [6, 7, 8], [6, 7, 8]])
    assert greedy_hits(T(5), guesses, preds).tolist() == [2, 3, 0, 1]


def payload(z, guesses, preds, first=0, deep=(), s=3, slots=4, rows=1):
    head, after = greedy_verdict(T(z), T(guesses).view(-1, s), T(preds).view(-1, s), first)
    return pack_payload(head, after, T(list(deep)), slots, rows).tolist()


def test_payload_layout_and_bonus_token():
    p = payload(5, [[5, 6, 7], [5, 6, 9]], [[6, 7, 8], [6, 7, 8]], first=10, deep=[1, 2], rows=9)
    assert p[:HEADER] == [5, 3, 10, 2, 9]       # all 3 guesses of candidate 10 match; 9 rows fed
    assert p[HEADER:HEADER + 3] == [6, 7, 8]    # ...and 8 is the free 4th token
    assert p[HEADER + 3:] == [1, 2, -1, -1]
    d = decide([p], 3)
    assert d.emitted == [5, 6, 7, 8] and d.hits == 3 and d.candidate == 10 and d.deepest == [1, 2]
    assert d.rows == [9]


def test_every_rank_learns_every_ranks_fed_rows():
    """The rows each rank fed travel in the payload, so every rank knows the busiest one."""
    a = payload(5, [[5, 1, 0]], [[9, 0, 0]], first=0, deep=[1], rows=7)
    b = payload(5, [], [], deep=[2, 3], rows=12)
    c = payload(5, [[5, 6, 7]], [[6, 1, 0]], first=1, rows=4)
    d = decide([a, b, c], 3)
    assert d.rows == [7, 12, 4] and d.deepest == [1, 2, 3] and d.emitted == [5, 6, 1]


def test_no_candidates_emits_next_token():
    d = decide([payload(5, [], [], deep=[3])], 3)
    assert d.emitted == [5] and d.hits == 0 and d.candidate == -1 and d.deepest == [3]


def test_ties_go_to_lowest_global_index():
    local = payload(5, [[5, 1, 0], [5, 2, 0]], [[9, 0, 0], [2, 5, 0]])       # best local: index 1
    assert local[:3] == [5, 2, 1]
    a = payload(5, [[5, 2, 0]], [[2, 4, 0]], first=3, deep=[1])               # 2 hits at global 3
    b = payload(5, [[5, 2, 1]], [[2, 4, 0]], first=1, deep=[2])               # 2 hits at global 1
    d = decide([a, b], 3)
    assert d.candidate == 1 and d.emitted == [5, 2, 4] and d.deepest == [1, 2]


def test_longest_hit_wins_across_ranks():
    a = payload(5, [[5, 0, 0]], [[1, 1, 1]], first=0)
    b = payload(5, [[5, 6, 7]], [[6, 7, 8]], first=1)
    assert decide([a, b], 3).emitted == [5, 6, 7, 8]


def test_rank0_next_token_is_authoritative():
    a = payload(5, [], [])
    b = payload(6, [[6, 7, 8]], [[7, 8, 9]], first=0)    # disagrees with rank 0 on z*: no hit
    d = decide([a, b], 3)
    assert d.emitted == [5] and d.hits == 0

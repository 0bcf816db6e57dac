"""The m-gram index behind lookup spans and suffix drafts, against brute-force rescans;
suffix drafts' scores, sizes and choice of match length."""
import random

import pytest

from lp.decode.suffix import SuffixIndex


class LookupIndex:
    """Lookup spans over one growing sequence (the engine's per-request index)."""

    def __init__(self, max_ngram, tokens=(), scan=64):
        self.max_ngram, self.index = max_ngram, SuffixIndex(max_ngram, scan)
        self.seq = self.index.add(tokens)

    @property
    def tokens(self):
        return self.index.seqs[self.seq]

    def __len__(self):
        return len(self.tokens)

    def extend(self, tokens):
        self.index.extend(self.seq, tokens)

    def candidates(self, count, length):
        return self.index.spans(self.tokens, count, length, self.max_ngram)


def rescan(tokens, count, length, max_ngram):
    """The specification, by rescanning the whole sequence: longest m first, most
    recent occurrence first, continuations merged (no duplicates, no prefixes)."""
    n, out = len(tokens), []
    for m in range(min(max_ngram, n - 1), 0, -1):
        suffix = tokens[n - m:]
        for end in range(n - 1, m - 1, -1):
            if tokens[end - m:end] != suffix:
                continue
            cont = tuple(tokens[end:end + length])
            if any(c[:len(cont)] == cont for c in out):
                continue
            longer = [i for i, c in enumerate(out) if cont[:len(c)] == c]
            if longer:
                out[longer[0]] = cont
                out = [c for i, c in enumerate(out) if i not in longer[1:]]
            elif len(out) < count:
                out.append(cont)
            if len(out) == count:
                return out
    return out


def test_example_longest_match_most_recent_first():
    seq = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    index = LookupIndex(3, seq)
    # last 3 tokens (1, 2, 3) occurred at the start: followed by 4 9 2
    # then m = 2 (2, 3): most recent first -> 5 6 7, then 4 9 2 (already there)
    # then m = 1 (3): the same two continuations
    assert index.candidates(count=4, length=3) == [(4, 9, 2), (5, 6, 7)]
    assert index.candidates(count=1, length=3) == [(4, 9, 2)]
    assert LookupIndex(2, seq).candidates(count=4, length=2) == [(5, 6), (4, 9)]
    assert LookupIndex(1, seq).candidates(count=4, length=5) == [(5, 6, 7, 1, 2), (4, 9, 2, 3, 5)]


def test_continuation_stops_at_the_end_of_the_sequence():
    seq = [5, 6, 5, 6, 5]
    # the most recent earlier 5 is followed by 6 5 only (the sequence ends), the one
    # before by 6 5 6 5, which extends it and takes its slot
    assert LookupIndex(1, seq).candidates(count=3, length=4) == [(6, 5, 6, 5)]
    assert LookupIndex(2, seq).candidates(count=3, length=2) == [(6, 5)]


def test_no_earlier_occurrence_no_candidates():
    assert LookupIndex(3, [1, 2, 3, 4]).candidates(5, 4) == []
    assert LookupIndex(3, [7]).candidates(5, 4) == []
    assert LookupIndex(3, []).candidates(5, 4) == []
    assert LookupIndex(2, [1, 1]).candidates(0, 4) == []


@pytest.mark.parametrize("seed", range(30))
def test_incremental_index_equals_rescan(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12])
    max_ngram, count, length = rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 9)
    index = LookupIndex(max_ngram, [rng.randrange(vocab) for _ in range(rng.randint(0, 5))], scan=10 ** 9)
    while len(index) < 80:   # grows in chunks, like committed rounds
        index.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 6)))
        assert index.candidates(count, length) == rescan(index.tokens, count, length, max_ngram)


def test_scan_limits_the_occurrences_looked_at():
    seq = [0, 1, 0, 2, 0, 3, 0, 4, 0]   # 0 occurred 4 times before the end
    assert LookupIndex(1, seq, scan=2).candidates(10, 1) == [(4,), (3,)]
    assert LookupIndex(1, seq).candidates(10, 1) == [(4,), (3,), (2,), (1,)]


def test_bad_max_ngram():
    with pytest.raises(ValueError, match="max_ngram"):
        SuffixIndex(0)


# ---------------------------------------------------------------- suffix drafts


def brute_matches(seqs, context, max_match, max_ngram):
    """Every L with an occurrence of context[-L:] followed by a token, and those occurrences
    (sequence, end), by rescanning every sequence; past max_ngram only the lengths at which
    some occurrence's match ends (a length between two of those has the same occurrences
    as the longer one, with a smaller draft: never a better one)."""
    out = []
    for length in range(1, min(max_match, len(context)) + 1):
        tail = context[len(context) - length:]
        found = {(s, e) for s, seq in enumerate(seqs) for e in range(length, len(seq))
                 if seq[e - length:e] == tail}
        if not found:
            break
        out.append((length, found))
    return [(length, found) for i, (length, found) in enumerate(out)
            if length <= max_ngram or i + 1 == len(out) or out[i + 1][1] != found]


@pytest.mark.parametrize("seed", range(25))
def test_matches_equal_a_rescan(seed):
    rng = random.Random(seed)
    vocab, max_ngram = rng.choice([2, 3, 6]), rng.randint(1, 5)
    index = SuffixIndex(max_ngram, scan=10 ** 9)
    for _ in range(rng.randint(1, 3)):
        index.add(rng.randrange(vocab) for _ in range(rng.randint(0, 30)))
    context = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
    for max_match in (3, 64):
        got = [(length, set(found)) for length, found in index.matches(context, max_match)]
        assert got == brute_matches(index.seqs, context, max_match, max_ngram)


def brute_continuations(seqs, found, limit, min_score):
    """The draft's nodes as a set of token paths with their scores, by counting, for every path of
    up to `limit` tokens, the occurrences whose continuation starts with it; the `limit` best by
    (count, shallower, the first occurrence reaching it) among those scored at least min_score."""
    counts, first = {}, {}
    for k, (s, e) in enumerate(found):
        cont = tuple(seqs[s][e:e + limit])
        for d in range(1, len(cont) + 1):
            counts[cont[:d]] = counts.get(cont[:d], 0) + 1
            first.setdefault(cont[:d], k)
    total = len(found)
    kept = [p for p in counts if counts[p] / total >= min_score]
    kept.sort(key=lambda p: (-counts[p], len(p), first[p]))
    return {p: counts[p] / total for p in kept[:limit]}


def random_corpus(rng: random.Random, context_most: int) -> tuple[SuffixIndex, list[int]]:
    """An index of 1-3 random sequences over a 2-5 token vocabulary, and a context of up to
    `context_most` tokens from the same vocabulary."""
    vocab = rng.choice([2, 3, 5])
    index = SuffixIndex(rng.randint(1, 4), scan=rng.choice([3, 64]))
    for _ in range(rng.randint(1, 3)):
        index.add(rng.randrange(vocab) for _ in range(rng.randint(0, 80)))
    return index, [rng.randrange(vocab) for _ in range(rng.randint(1, context_most))]


@pytest.mark.parametrize("seed", range(30))
def test_draft_trees_equal_a_count_of_every_continuation(seed):
    """Every match length's tree (not only the winner): its nodes and their scores, in the order
    the occurrences reach them (parents first)."""
    rng = random.Random(seed)
    index, context = random_corpus(rng, 10)
    for (match, found), limit, min_score in zip(index.matches(context), rng.choices([1, 3, 8, 40], k=99),
                                                rng.choices([0.0, 0.1, 0.34, 1.0], k=99)):
        d = index._continuations(found, match, limit, min_score)
        got = {tuple(d.tokens[u] for u in path(d, i)): d.scores[i] for i in range(len(d))}
        assert got == brute_continuations(index.seqs, found, limit, min_score)
        assert all(d.parents[i] < i for i in range(len(d))) and d.match == match
        reached = [(min(k for k, (s, e) in enumerate(found)      # (first occurrence reaching it, depth)
                        if index.seqs[s][e:e + len(path(d, i))] == [d.tokens[u] for u in path(d, i)]),
                    len(path(d, i))) for i in range(len(d))]
        assert reached == sorted(reached)


@pytest.mark.parametrize("seed", range(300))
def test_draft_is_the_best_tree_over_every_match_length(seed):
    """draft() returns the tree of largest gain (sum of score - min_score) over every match length's
    tree, the longest match on ties, though it builds only some of them (it skips lengths whose
    largest draft cannot win and shorter lengths with the same occurrences as the one before)."""
    rng = random.Random(seed)
    index, context = random_corpus(rng, 12)
    max_nodes, factor, min_score = rng.choice([1, 4, 32]), rng.choice([1.0, 2.5, 8.0]), rng.choice([0.0, 0.1, 0.5])
    best, gain = None, 0.0
    for match, found in reversed(index.matches(context)):
        d = index._continuations(found, match, min(max_nodes, int(factor * match + 1e-9)), min_score)
        g = sum(d.scores) - min_score * len(d)
        if g > gain:
            best, gain = d, g
    got = index.draft(context, max_nodes, factor, min_score)
    assert got == best if best is not None else len(got) == 0


def test_an_empty_context_matches_nothing():
    index = SuffixIndex(2)
    index.add([1, 2, 3])
    assert index.matches([]) == [] and len(index.draft([], max_nodes=4)) == 0


def test_draft_scores_are_continuation_frequencies():
    index = SuffixIndex(2)
    index.add([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 9])
    d = index.draft([7, 1, 2, 3], max_nodes=10, factor=3)   # 1 2 3 occurs 3 times with a next token
    got = {tuple(d.tokens[u] for u in path(d, i)): d.scores[i] for i in range(len(d))}
    assert d.match == 3
    assert got[(4,)] == pytest.approx(2 / 3) and got[(5,)] == pytest.approx(1 / 3)
    assert got[(4, 1)] == pytest.approx(1 / 3) and got[(4, 9)] == pytest.approx(1 / 3)
    assert all(d.parents[i] < i for i in range(len(d)))          # parents first


def path(d, i):
    out = []
    while i >= 0:
        out.append(i)
        i = d.parents[i]
    return out[::-1]


def test_draft_size_adapts_to_the_match_length():
    index = SuffixIndex(8)
    index.add(list(range(40)))
    for match in (1, 2, 5):
        d = index.draft([99] + list(range(10 - match, 10)), max_nodes=100, factor=2)
        assert d.match == match and len(d) == 2 * match       # a chain of factor * L nodes
        assert d.tokens == list(range(10, 10 + 2 * match))
    assert len(index.draft(list(range(10)), max_nodes=7, factor=2)) == 7   # the budget caps it


def test_min_score_drops_rare_continuations_and_picks_the_best_gain():
    index = SuffixIndex(4)
    index.add([1, 2, 8] + [1, 2, 3] * 5 + [0])
    d = index.draft([1, 2], max_nodes=20, factor=10, min_score=0.2)
    assert 8 not in d.tokens and d.tokens[0] == 3 and min(d.scores) >= 0.2
    d0 = index.draft([1, 2], max_nodes=20, factor=10, min_score=0.0)
    assert 8 in d0.tokens


def test_jobwide_index_reads_earlier_sequences():
    job = SuffixIndex(4)
    job.add([10, 11, 12, 13, 14])
    job.add([20, 21])
    d = job.draft([5, 11, 12], max_nodes=8, factor=4)
    assert d.tokens == [13, 14] and d.match == 2   # what followed in the first completion


def occurrences(index: SuffixIndex, first: int = 0) -> dict:
    """Every m-gram's occurrences in the sequences from `first` on, oldest first."""
    out = {}
    for key, bucket in index._ends.items():
        found = [(s, e) for s, e in reversed(index._occurrences(key, len(bucket) // 8)) if s >= first]
        if found:
            out[key] = found
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_bounded_index_forgets_the_oldest_sequences(seed):
    """Past `most_tokens` the oldest sequences are forgotten whole, the fewest that bring it under, never
    the newest: every occurrence of the others is kept, in order, whether the sequences were added
    whole (a job's completions) or grew side by side; added whole, its drafts and spans are those of an
    index of the kept sequences alone."""
    rng = random.Random(seed)
    vocab, max_ngram, most = rng.choice([2, 3, 6]), rng.randint(1, 5), rng.choice([0, 10, 40, 100])
    side_by_side = rng.random() < 0.5
    index, unbounded, lengths = SuffixIndex(max_ngram, most_tokens=most), SuffixIndex(max_ngram), []
    for _ in range(rng.randint(1, 12)):
        lengths.append(rng.randint(0, 30))
        tokens = [rng.randrange(vocab) for _ in range(lengths[-1])]
        index.add(tokens), unbounded.add(tokens)
        last = len(lengths) - 1
        assert index.first == min([f for f in range(last) if sum(lengths[f:]) <= most] + [last])
        if side_by_side:                # an older kept sequence grows after a newer one started
            grown, tokens = rng.randrange(index.first, last + 1), [rng.randrange(vocab) for _ in range(5)]
            index.extend(grown, tokens), unbounded.extend(grown, tokens)
            lengths[grown] += 5
        kept = index.seqs[index.first:]
        assert kept == unbounded.seqs[index.first:] and all(not s for s in index.seqs[:index.first])
        assert len(index) == sum(map(len, kept))
        assert occurrences(index) == occurrences(unbounded, index.first)
        if side_by_side:
            continue
        fresh = SuffixIndex(max_ngram)
        for seq in kept:
            fresh.add(seq)
        for _ in range(5):
            context = [rng.randrange(vocab) for _ in range(rng.randint(1, 10))]
            assert index.draft(context, 8, 4.0) == fresh.draft(context, 8, 4.0)
            assert index.spans(context, 3, 4, max_ngram) == fresh.spans(context, 3, 4, max_ngram)


def test_a_forgotten_sequence_cannot_grow():
    index = SuffixIndex(2, most_tokens=3)
    old = index.add([1, 2, 3])
    index.add([4, 5])
    assert index.first == 1 and len(index) == 2
    with pytest.raises(ValueError, match="forgotten"):
        index.extend(old, [6])
    with pytest.raises(ValueError, match="most_tokens must be >= 0"):
        SuffixIndex(2, most_tokens=-1)


def test_the_job_cache_is_bounded():
    from lp.decode import propose
    from lp.decode.params import LookaheadParams
    corpus = propose.job_cache(LookaheadParams(suffix_factor=8.0, job_cache=True))
    assert corpus.most_tokens == propose.JOB_CACHE_TOKENS

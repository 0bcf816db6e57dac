"""Rank 0's candidate sources for one request, merged into one token tree per round.

Sources (each optional, see LookaheadParams):
- the n-gram pool: suffixes harvested from the Jacobi window's trajectories
  and, with `pool_seeding`, from the prompt and the committed output, keyed
  by the last committed token;
- lookup spans: what followed earlier occurrences of the last few tokens in
  the prompt and output;
- suffix drafts: the continuations of the longest earlier match of the
  context in this request and, with `job_cache`, in the job's earlier
  completions (a SuffixIndex the job owns and grows).

Every source gives scored paths; `TreeBuilder` merges them (a node reached
twice keeps its best score) and keeps the `tree_budget` best nodes. Suffix
drafts are scored by the fraction of matched occurrences that continue
through a node. Pool and lookup paths are guesses without counts: each path
scores GUESS_SCORE, so within the budget they rank below any suffix node
reached by at least that fraction of occurrences, shallower nodes first.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from lp.decode.params import LookaheadParams
from lp.decode.pool import NGramPool, sequence_ngrams
from lp.decode.suffix import SuffixIndex
from lp.decode.tree import TokenTree, TreeBuilder

GUESS_SCORE = 0.5
SUFFIX_NGRAM = 8     # m-grams indexed; longer matches are found by extending an occurrence
# the job cache keeps the latest completions up to this many tokens, forgetting the earliest first: about
# 550 bytes a token (scripts/bench_index.py: random code-like text), so at most about 0.55 GiB
# of host memory however long the job; a draft reads only an m-gram's 64 latest occurrences anyway
JOB_CACHE_TOKENS = 1 << 20


def job_cache(params: LookaheadParams) -> SuffixIndex | None:
    """The job-wide index of earlier completions, when the params use one (the latest JOB_CACHE_TOKENS
    tokens of them)."""
    if not (params.suffix and params.job_cache):
        return None
    return SuffixIndex(max(SUFFIX_NGRAM, params.lookup_ngram), most_tokens=JOB_CACHE_TOKENS)


class Proposer:
    def __init__(self, params: LookaheadParams, prompt: Sequence[int], corpus: SuffixIndex | None = None):
        self.params = params
        self.tokens = list(prompt)          # committed: prompt + output
        n, g = params.ngram, params.guesses
        self.pool = NGramPool(n - 1, g) if g else None
        self.seeded = 0                     # n-grams of `tokens` already in the pool
        if self.pool is not None and params.pool_seeding:
            self.pool.update(sequence_ngrams(self.tokens, n))
            self.seeded = max(len(self.tokens) - n + 1, 0)
        self.index = None
        if params.lookup_candidates or params.suffix:
            self.index = SuffixIndex(max(SUFFIX_NGRAM, params.lookup_ngram))
            self.seq = self.index.add(self.tokens)
        self.corpus = corpus if params.suffix and params.job_cache else None

    def tree(self, max_depth: int | None = None) -> TokenTree:
        """This round's candidates, `max_depth` tokens deep at most."""
        return self.candidates(max_depth).build(self.params.tree_budget or None)

    def candidates(self, max_depth: int | None = None) -> TreeBuilder:
        """This round's candidates, scored, `max_depth` tokens deep at most, before the tree budget
        cuts them."""
        p, builder = self.params, TreeBuilder(max_depth)
        if max_depth is not None and max_depth < 1:
            return builder
        if p.suffix:
            for index in (self.index, self.corpus):
                if index is not None:
                    d = index.draft(self.tokens, p.suffix_tokens, p.suffix_factor, p.suffix_min_score)
                    builder.add_tree(d.tokens, d.parents, d.scores)
        if p.lookup_candidates:
            for span in self.index.spans(self.tokens, p.lookup_candidates, p.lookup_tokens, p.lookup_ngram):
                builder.add(span, GUESS_SCORE)
        if self.pool is not None:
            for suffix in self.pool.candidates(self.tokens[-1], p.guesses):
                builder.add(suffix, GUESS_SCORE)
        return builder

    def commit(self, emitted: Sequence[int], window_ngrams: Iterable[tuple[int, Sequence[int]]] = ()) -> None:
        """After a round: the window's n-grams, then the committed tokens."""
        if self.pool is not None:
            self.pool.update(window_ngrams)
        self.tokens += emitted
        if self.index is not None:
            self.index.extend(self.seq, emitted)
        if self.pool is not None and self.params.pool_seeding:
            n = self.params.ngram
            self.pool.update(sequence_ngrams(self.tokens, n, start=self.seeded))
            self.seeded = max(len(self.tokens) - n + 1, self.seeded)

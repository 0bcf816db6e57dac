"""generate's score processors that lookahead applies exactly: sequence_bias, the repetition
penalty, the min-new-tokens EOS hold-back, no_repeat_ngram_size, bad_words_ids, forced_eos_token_id,
suppress_tokens and begin_suppress_tokens (`generation.*` of those names).

Each changes a row's scores by what came before the row's prediction, so each verified row gets its
own: z*'s row predicts the request's k-th new token (k committed so far) from the prompt and the
committed output; a tree node at depth d predicts token k + d from those and the tokens of its own
path, itself included. Applied to every row before the argmax (greedy) or the warpers (sampling),
the walk accepts a node exactly when plain decoding with the same processors would have produced
its token, so exactness holds as without them. The window's deepest cells (the rows whose argmax
feeds the pool) get the penalty of the request's tokens before the round: they only propose, but
guesses from raw logits would rarely match a penalised output.

- **Repetition penalty** (transformers' RepetitionPenaltyLogitsProcessor): a score s of a token
  the row's input holds becomes s * p when s < 0, else s / p. The request's tokens before the round
  live on the device as one presence row per request ([V + 1] bool: column V takes ids past the
  logits' V, which generate leaves out too), updated each round with the tokens committed since
  the last one (the round's upload carries them); a node row adds its path's tokens.
- **min_new_tokens**: the EOS ids' scores are -inf in a row predicting new token k + d <
  min_new_tokens (transformers' MinNewTokensLengthLogitsProcessor; MinLengthLogitsProcessor is the
  same with the prompt's length taken off).
- **no_repeat_ngram_size** n and multi-token **bad_words_ids** (NoRepeatNGramLogitsProcessor,
  NoBadWordsLogitsProcessor): a row may not emit a token that completes an n-gram its input already
  holds, nor the last token of a bad word whose other tokens end its input. The host keeps each
  request's n-grams (`RowBans`) and lists every verified row's banned tokens; they travel in the
  round's upload and become -inf. A one-token bad word (other than an EOS id, which generate leaves
  out) is -inf in every verified row.
- **sequence_bias** (SequenceBiasLogitsProcessor, first of all): a one-token entry's bias is added to
  that token's score in every verified row; a longer entry's to its last token's score in a row whose
  input ends with its other tokens (RowBans lists those cells, as the bans). Two entries that could
  complete on one token at once are refused (GenerationParams), so a cell gets at most one.
- **forced_eos_token_id** (ForcedEOSTokenLogitsProcessor): the row that predicts the last new token
  (the max_new_tokens-th) scores those ids 0 and every other token -inf, after the bans, the bad
  words and the hold-back (which it overwrites, a forced id that is a bad word included) and before
  the suppressed tokens (which it does not: its scores leave the suppressed ids out).
- **suppress_tokens** (SuppressTokensLogitsProcessor): those tokens, EOS ids included, are -inf in
  every verified row, as one-token bad words. **begin_suppress_tokens**
  (SuppressTokensAtBeginLogitsProcessor): -inf in the row that predicts a request's first new
  token, z*'s row of its first round.

Scores are processed in float32 as generate processes them, in its order: the biases, the penalty,
then the bans and the hold-back (each -inf, which the penalty keeps), then the sampling warpers. float64
logits stay float64, where generate casts them to float32 first: as for lp's plain argmax, the two
differ only at a near-tie below float32's resolution.

A caller's own processors (a `RowProcessor`: the generate drop-in's and lp.generate's logits processors
that lp has no device form of, such as prefix_allowed_tokens_fn or a LogitsProcessor of the user's) run
after these, on every verified row's scores with that row's own input ids (`process_by_input`), so they
are exact too when each treats its rows on their own, as generate's processors do.

`SeenPrompt` is the prompt as generate's processors see it when that is not the ids lp decodes from
(the generate drop-in's left-padded rows).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import torch

from lp.decode.params import GenerationParams
from lp.decode.tree import TokenTree

if TYPE_CHECKING:
    from lp.decode.request import RequestState, RoundPlan

FRESH_PAD = 1 << 62      # a `fresh` section's padding: clamped to the spare column V on the device
# a caller's processor of verified rows: (request key, input_ids [m, L], scores [m, V]) -> scores [m, V]
RowProcessor = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]


@contextmanager
def as_generate_calls():
    """The mode a caller's own code (processors, stopping criteria, streamers) runs in: no_grad outside
    the inference mode lp decodes in, as generate calls it. A tensor it makes and keeps is then an
    ordinary one (an inference tensor refuses in-place updates once the decode is over); what it is
    handed must be made inside (`plain`)."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def plain(t: torch.Tensor) -> torch.Tensor:
    """`t` as an ordinary tensor (a copy of an inference tensor), under as_generate_calls."""
    return t.clone() if t.is_inference() else t


class SeenPrompt(NamedTuple):
    """The prompt as generate's processors see it: `ids`, generate's input_ids row (left padding
    included), and `penalty_start`, where the repetition penalty starts counting in it (transformers'
    prompt_ignore_length)."""
    ids: Sequence[int]
    penalty_start: int = 0


class RowInput(NamedTuple):
    """What a verified row's input asks of its scores: the tokens it bans (`banned`), and the multi-token
    sequence_bias entries its input completes (`biased`: (last token, entry index in
    multi_token_biases))."""
    banned: set[int]
    biased: list[tuple[int, int]]


def multi_token_biases(generation: GenerationParams) -> list[tuple[tuple[int, ...], float]]:
    """generation.sequence_bias's entries of two tokens or more, in order: (token ids, bias)."""
    return [(ids, bias) for ids, bias in generation.sequence_bias if len(ids) > 1]


class RowBans:
    """no_repeat_ngram_size, multi-token bad_words_ids and multi-token sequence_bias for one request, on
    the host: the n-grams of its input so far (`seen`: the prompt as the processors see it, then the
    output) and, for a round's tree, what each verified row's input bans or biases."""

    @staticmethod
    def wanted(generation: GenerationParams) -> bool:
        """Whether `generation` bans or biases anything that depends on a row's input (one-token words
        and biases do not)."""
        return (generation.no_repeat_ngram_size > 0 or any(len(w) > 1 for w in generation.bad_words_ids)
                or bool(multi_token_biases(generation)))

    def __init__(self, generation: GenerationParams, seen: Sequence[int]):
        self.n = generation.no_repeat_ngram_size
        self.words = [(tuple(w[:-1]), w[-1]) for w in generation.bad_words_ids if len(w) > 1]
        self.biases = [(tuple(ids[:-1]), ids[-1]) for ids, _ in multi_token_biases(generation)]
        self.keep = max([self.n - 1 if self.n else 0]
                        + [len(prefix) for prefix, _ in self.words + self.biases])  # tail length
        self.seq: list[int] = []
        self.grams: dict[tuple[int, ...], set[int]] = {}     # (n - 1)-token prefix -> tokens that followed it
        self.extend(seen)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.seq.append(int(t))
            if self.n and len(self.seq) >= self.n:
                self.grams.setdefault(tuple(self.seq[len(self.seq) - self.n:-1]), set()).add(self.seq[-1])

    def _row(self, tail: tuple[int, ...], length: int, path: dict[tuple[int, ...], set[int]]) -> RowInput:
        """A row's bans and biases: its input is `length` tokens ending with `tail`; `path` holds the
        n-grams that end on the row's path. A word or biased sequence counts once its prefix fits the
        input (transformers 5.24 on; 5.17 asked the whole sequence to fit)."""
        out: set[int] = set()
        if self.n and length + 1 >= self.n:
            key = tail[len(tail) - self.n + 1:] if self.n > 1 else ()
            out |= self.grams.get(key, set()) | path.get(key, set())
        for prefix, last in self.words:
            if length >= len(prefix) and tail[len(tail) - len(prefix):] == prefix:
                out.add(last)
        biased = [(last, i) for i, (prefix, last) in enumerate(self.biases)
                  if length >= len(prefix) and tail[len(tail) - len(prefix):] == prefix]
        return RowInput(out, biased)

    def rows(self, tree: TokenTree, nodes: range) -> list[RowInput]:
        """The bans and biases of z*'s row, then of each of `nodes` (a preorder range of `tree`: whole
        root subtrees, so every node's parent comes before it or is the root)."""
        length, keep = len(self.seq), self.keep
        root_tail = tuple(self.seq[max(0, length - keep):]) if keep else ()
        out = [self._row(root_tail, length, {})]
        tails: dict[int, tuple[int, ...]] = {}
        paths: dict[int, dict[tuple[int, ...], set[int]]] = {}
        for u in nodes:
            parent, token, depth = tree.parents[u], tree.tokens[u], tree.depths[u]
            before = tails[parent] if parent >= 0 else root_tail
            grams = paths[parent] if parent >= 0 else {}
            if self.n and length + depth >= self.n:      # the n-gram that ends on this node's token
                key = before[len(before) - self.n + 1:] if self.n > 1 else ()
                grams = {**grams, key: grams.get(key, set()) | {token}}
            tails[u] = (before + (token,))[max(0, len(before) + 1 - keep):] if keep else ()
            paths[u] = grams
            out.append(self._row(tails[u], length + depth, grams))
        return out


def penalize(scores: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' repetition penalty of every score (the processor applies it to held tokens only)."""
    return torch.where(scores < 0, scores * penalty, scores / penalty)


def process_rows(frame: torch.Tensor, deep: int, seen: torch.Tensor | None, tok: torch.Tensor,
                 ancestors: torch.Tensor, hold: torch.Tensor | None, eos: torch.Tensor | None,
                 penalty: float, bans: torch.Tensor | None = None, words: torch.Tensor | None = None,
                 opening: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 biased: tuple[torch.Tensor, torch.Tensor] | None = None,
                 forced: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The processed scores of a round's frame, [n, D + 1 + N, V]: `frame` holds the window's `deep`
    (D) deepest cells, z*'s row, then the node frame's N rows; `seen` [n, V + 1] bool the tokens each
    request's input held before the round (None: no penalty); `tok` [n, N] the node frame's tokens
    (-1: PAD); `ancestors` [n, N, N] bool, (i, j) when node j is i or one of its ancestors; `hold`
    [n, 1 + N] bool the verified rows (z*'s, the nodes') whose `eos` ([V] bool) scores are held at
    -inf (None: none); `bans` flat indices into the frame of banned (row, token) cells; `words` [V]
    bool the tokens banned in every verified row; `opening` [n, V] bool the tokens banned in z*'s row
    (a request's first new token: begin_suppress_tokens); `bias` [V] float32 sequence_bias's one-token
    biases, added first to every verified row, and `biased` (flat cells, their biases) the cells whose
    row completes a multi-token sequence_bias entry, whose bias (plus the one-token bias of its token,
    summed in the scores' dtype as generate's processor sums them) is added instead; `forced` ([n, 1 + N]
    bool the verified rows that predict the last new token, [V] their scores: 0 at the forced EOS ids,
    -inf elsewhere, suppressed ids included: generate suppresses after forcing, and its forcing
    overwrites every score, `words` included). The window's cells get the penalty of `seen` alone, and
    nothing else."""
    scores = frame if frame.dtype in (torch.float32, torch.float64) else frame.float()
    if bias is not None:
        lifted = scores.clone(memory_format=torch.contiguous_format)
        raw = lifted.view(-1)[biased[0]] if biased is not None else None
        lifted[:, deep:] += bias
        if biased is not None:
            lifted.view(-1)[biased[0]] = raw + biased[1]
        scores = lifted
    out = scores
    if seen is not None:
        v = scores.shape[-1]
        hit = penalize(scores, penalty)
        out = torch.where(seen[:, None, :v], hit, scores)
        n, nodes = tok.shape
        if nodes:
            # a node row also holds its path's tokens: write each path token's column of the row,
            # penalised when the column is held (from before the round or on the path), else as it
            # was; every write to one (row, column) computes the same value (PAD and ids past V
            # write their clamped column's own value)
            col = tok.clamp(0, v - 1)
            valid = (tok >= 0) & (tok < v)
            same = ((col[:, :, None] == col[:, None, :]) & valid[:, :, None]).to(scores.dtype)
            held = (torch.bmm(ancestors.to(scores.dtype), same) > 0) | seen.gather(1, col)[:, None, :]
            index = col[:, None, :].expand(n, nodes, nodes)
            first = deep + 1
            rows = torch.where(held, hit[:, first:].gather(2, index), scores[:, first:].gather(2, index))
            out[:, first:].scatter_(2, index, rows)
    if hold is None and bans is None and words is None and opening is None and forced is None:
        return out
    if out is frame or not out.is_contiguous():        # never write the model's logits
        out = out.contiguous() if out is not frame else out.clone(memory_format=torch.contiguous_format)
    if hold is not None:
        out[:, deep:].masked_fill_(hold[:, :, None] & eos, float("-inf"))
    if bans is not None:
        out.view(-1).index_fill_(0, bans, float("-inf"))
    if words is not None:
        out[:, deep:].masked_fill_(words, float("-inf"))
    if forced is not None:       # after the bans, the bad words and the hold-back, which it overwrites
        out[:, deep:] = torch.where(forced[0][:, :, None], forced[1].to(out.dtype), out[:, deep:])
    if opening is not None:
        out[:, deep].masked_fill_(opening, float("-inf"))
    return out


def _row_positions(states: Sequence[RequestState], plans: Sequence[RoundPlan], nodes: int) -> list[int]:
    """The new-token index each verified row predicts, request by request: z*'s row (k, the tokens
    committed so far), then each node of the frame at depth d (k + d), its padding -1."""
    out: list[int] = []
    for state, plan in zip(states, plans):
        k, depths = state.generated, plan.tree.depths
        out += [k, *(k + depths[u] for u in plan.nodes)] + [-1] * (nodes - len(plan.nodes))
    return out


def vocabulary_problem(generation: GenerationParams, vocab: int) -> str | None:
    """Why `generation`'s processors cannot run on a model of `vocab` logits (one line naming the key), or
    None: a token id past the logits in one of the keys generate refuses such an id in (bad_words_ids,
    sequence_bias) or fails on (forced_eos_token_id). suppress_tokens and begin_suppress_tokens past
    them suppress nothing, in generate and in lp alike."""
    for key, ids in (("bad_words_ids", [t for word in generation.bad_words_ids for t in word]),
                     ("sequence_bias", [t for ids, _ in generation.sequence_bias for t in ids]),
                     ("forced_eos_token_id", generation.forced_eos_token_id)):
        past = sorted({t for t in ids if not 0 <= t < vocab})
        if past:
            return f"generation.{key}: token ids {past} are past the model's {vocab} logits (ids 0 to {vocab - 1})"
    return None


class Processors:
    """generate's processors for a decode: what a round uploads for them and their work on its frame.
    Each request keeps its tokens not yet on the device (`RequestState.unseen`), its device presence
    row (`RequestState.seen`) and its n-grams (`RequestState.bans`, RowBans)."""

    def __init__(self, generation: GenerationParams, eos_token_ids: Sequence[int], device: torch.device, vocab: int):
        self.penalty = generation.repetition_penalty
        self.least = generation.min_new_tokens if eos_token_ids else 0
        self.eos_ids, self.device, self.vocab = list(eos_token_ids), device, vocab
        # the tokens no verified row emits: one-token bad words but EOS ids (generate leaves those out), and
        # suppress_tokens
        self.suppressed = set(generation.suppress_tokens)
        self.word_ids = sorted(({w[0] for w in generation.bad_words_ids if len(w) == 1} - set(self.eos_ids))
                               | self.suppressed)
        self.begin_ids = sorted(set(generation.begin_suppress_tokens))    # at a request's first new token
        self.forced_ids = sorted(set(generation.forced_eos_token_id))     # at its last new token
        self.last = generation.max_new_tokens - 1
        self.forced = None              # [V]: 0 at the forced ids, -inf elsewhere
        self.eos = self.words = self.begin = None    # [V] bool masks, made at the first round that needs them
        self.empty = None               # [V + 1] bool zeros: a request's presence before its first round
        # sequence_bias: the one-token biases and the multi-token entries' (last token, bias), float32 as
        # generate keeps them; on the device at the first round: the one-token biases [V] and each entry's
        # bias plus its last token's one-token bias, summed in the scores' dtype as generate sums them
        if problem := vocabulary_problem(generation, vocab):
            raise ValueError(problem)
        self.single = {ids[0]: bias for ids, bias in generation.sequence_bias if len(ids) == 1}
        self.multi = [(ids[-1], bias) for ids, bias in multi_token_biases(generation)]
        self.bias = self.table = None

    @staticmethod
    def wanted(generation: GenerationParams, eos_token_ids: Sequence[int]) -> bool:
        return (generation.repetition_penalty != 1.0 or (generation.min_new_tokens > 0 and bool(eos_token_ids))
                or generation.no_repeat_ngram_size > 0
                or any(getattr(generation, key) for key in ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
                                                            "sequence_bias", "forced_eos_token_id")))

    def sections(self, states: Sequence[RequestState], plans: Sequence[RoundPlan], deep: int,
                 nodes: int) -> dict[str, list[int]]:
        """The round's upload for them: per request the tokens committed since its last round
        ("fresh", padded alike), which of its verified rows hold EOS back ("hold": z*'s row, then the
        node frame's; none once every request has min_new_tokens), whether its z* row predicts its
        first new token ("first", with begin_suppress_tokens; none once no request does), and the
        frame cells (flat indices, the frame being [n, deep + 1 + nodes, V]) its n-grams and bad words
        ban ("bans") and those its multi-token sequence_bias entries complete ("biased": the cells,
        then each one's entry)."""
        out: dict[str, list[int]] = {}
        if self.penalty != 1.0:
            width = max(1, *(len(s.unseen) for s in states))
            out["fresh"] = [t for s in states for t in [*s.unseen, *[FRESH_PAD] * (width - len(s.unseen))]]
        if any(s.generated < self.least for s in states):
            out["hold"] = [int(0 <= p < self.least) for p in _row_positions(states, plans, nodes)]
        if self.begin_ids and any(s.generated == 0 for s in states):
            out["first"] = [int(s.generated == 0) for s in states]
        if self.forced_ids:     # the rows predicting the last new token ("last", laid out as "hold")
            last = [int(p == self.last) for p in _row_positions(states, plans, nodes)]
            if any(last):
                out["last"] = last
        bans, cells, entries, v, size = [], [], [], self.vocab, deep + 1 + nodes
        for b, (state, plan) in enumerate(zip(states, plans)):
            if state.bans is not None:
                for j, row in enumerate(state.bans.rows(plan.tree, plan.nodes)):
                    base = (b * size + deep + j) * v
                    bans += [base + t for t in row.banned if 0 <= t < v]
                    cells += [base + t for t, _ in row.biased]
                    entries += [i for _, i in row.biased]
        if bans:
            out["bans"] = bans
        if cells:
            out["biased"] = cells + entries
        return out

    def apply(self, frame: torch.Tensor, deep: int, states: Sequence[RequestState], dev: dict[str, torch.Tensor],
              tok: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """The round's `frame` processed (process_rows), each request's presence brought up to date
        first with its fresh tokens (they leave the host's `unseen`)."""
        n, v = frame.shape[0], frame.shape[-1]
        if v != self.vocab:
            raise RuntimeError(f"the model's logits have {v} columns, not the {self.vocab} rows of its output "
                               f"embedding: lp cannot place generate's processors on them")
        seen = hold = None
        if self.penalty != 1.0:
            if self.empty is None:
                self.empty = torch.zeros(v + 1, dtype=torch.bool, device=self.device)
            seen = torch.stack([s.seen if s.seen is not None else self.empty for s in states])
            seen.scatter_(1, dev["fresh"].view(n, -1).clamp(max=v), True)
            for i, state in enumerate(states):
                state.seen, state.unseen = seen[i], []
        if "hold" in dev:
            self.eos = self.eos if self.eos is not None else self._mask(self.eos_ids)
            hold = dev["hold"].view(n, -1).bool()
        if self.word_ids and self.words is None:
            self.words = self._mask(self.word_ids)
        opening = None
        if "first" in dev:
            self.begin = self.begin if self.begin is not None else self._mask(self.begin_ids)
            opening = dev["first"].view(n, 1).bool() & self.begin
        biased = None
        if (self.single or self.multi) and self.bias is None:
            self.bias = self._values(self.single.items(), v)
            lasts = self._values(enumerate(t for t, _ in self.multi), len(self.multi), torch.long)
            entries = self._values(enumerate(b for _, b in self.multi), len(self.multi))
            dtype = frame.dtype if frame.dtype == torch.float64 else torch.float32
            self.table = self.bias[lasts].to(dtype) + entries.to(dtype)
        if "biased" in dev:
            cells, entries = dev["biased"].view(2, -1)
            biased = (cells, self.table[entries])
        forced = None
        if "last" in dev:
            if self.forced is None:     # suppress_tokens come after the forcing in generate's order
                self.forced = torch.full((v,), float("-inf"), device=self.device).masked_fill_(
                    self._mask(sorted(set(self.forced_ids) - self.suppressed)), 0.0)
            forced = (dev["last"].view(n, -1).bool(), self.forced)
        return process_rows(frame, deep, seen, tok, ancestors, hold, self.eos, self.penalty, dev.get("bans"),
                            self.words, opening, self.bias, biased, forced)

    def _values(self, items, size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[size] zeros with `items`' (index, value) filled in on the device, one fill each, once."""
        out = torch.zeros(size, dtype=dtype, device=self.device)
        for i, value in items:
            if 0 <= i < size:     # rounded on the host as generate's float32 table rounds it (±inf past its range)
                out[i] = torch.tensor(value, dtype=dtype).item() if dtype.is_floating_point else value
        return out

    def _mask(self, ids: Sequence[int]) -> torch.Tensor:
        """[V] bool, True at `ids`: filled id by id on the device (a few fills once, no copy from the host)."""
        mask = torch.zeros(self.vocab, dtype=torch.bool, device=self.device)
        for t in ids:
            if 0 <= t < self.vocab:
                mask[t] = True
        return mask


def process_by_input(frame: torch.Tensor, deep: int, states: Sequence[RequestState], plans: Sequence[RoundPlan],
                     process: RowProcessor, writable: bool = False) -> torch.Tensor:
    """`frame` [n, D + 1 + N, V] with a caller's `process` applied to every verified row, after lp's own
    processors: called once per request and depth with the request's key, those rows' input ids as
    generate's processors see them ([m, L] on the frame's device: the request's seen prompt and output,
    then the node's path, itself included) and their scores ([m, V], float32 as generate processes
    them, float64 as lp's own), it returns their processed scores. The window's cells stay as they were
    (they only propose). The rows are written back into `frame` itself when it is `writable` (lp's own
    processed copy, or an eager forward's logits, which nothing else reads; a CUDA graph's outputs are
    its own) and it is float32 or float64, else into a copy."""
    exact = frame.dtype in (torch.float32, torch.float64)
    out = frame if exact and writable else frame.clone() if exact else frame.float()
    for i, (state, plan) in enumerate(zip(states, plans)):
        tree = plan.tree
        seen = torch.tensor(state.seen_tokens, dtype=torch.long, device=out.device)
        groups: dict[int, tuple[list[int], list[int]]] = {0: ([deep], [])}    # depth -> (rows, their paths)
        paths: dict[int, list[int]] = {-1: []}
        for j, u in enumerate(plan.nodes):      # whole root subtrees in preorder: a parent comes first
            paths[u] = paths[tree.parents[u]] + [tree.tokens[u]]
            rows, tokens = groups.setdefault(tree.depths[u], ([], []))
            rows.append(deep + 1 + j)
            tokens += paths[u]
        for depth, (rows, tokens) in groups.items():
            index = torch.tensor(rows, device=out.device)
            scores = out[i, index]
            path = torch.tensor(tokens, dtype=torch.long, device=out.device).view(len(rows), depth)
            processed = process(state.key, torch.cat([seen.expand(len(rows), -1), path], dim=1), scores)
            if not isinstance(processed, torch.Tensor) or processed.shape != scores.shape:
                raise ValueError(f"a logits processor returned {type(processed).__name__} "
                                 f"{tuple(getattr(processed, 'shape', ()))} for scores of shape {tuple(scores.shape)}")
            out[i, index] = processed.to(out.dtype)
    return out

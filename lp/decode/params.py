"""The engine's parameters: config sections `lookahead` and `generation`."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


# lookahead's sizes: columns, n-gram lengths, candidates, tokens and nodes per round. A round feeds a few
# of them multiplied, so anything near this is already more rows than a device holds; above it, sizes
# overflow the allocator's arithmetic
COUNT_KEYS = ("window", "ngram", "guesses", "lookup_candidates", "lookup_tokens", "lookup_ngram", "suffix_tokens",
              "tree_budget")
MOST_COUNT = 65536


@dataclass
class LookaheadParams:
    """Config section `lookahead`: where a round's candidates come from and how many.

    - the Jacobi window: W columns, N-gram size; G pool suffixes per round (and
      per pool key), the pool optionally seeded from the prompt and output;
    - up to `lookup_candidates` prompt/output lookup spans of up to
      `lookup_tokens` tokens, matched on the last `lookup_ngram`..1 tokens;
    - suffix drafts (`suffix_factor` > 0): the continuations of the longest
      earlier match of the context in this request (prompt and output) and,
      with `job_cache`, in the job's earlier completions; at most
      min(`suffix_tokens`, factor x match length) nodes each, none scored
      below `suffix_min_score`;
    - all merged into one token tree of at most `tree_budget` nodes (0: no cut
      beyond each source's own limit), the best-scoring nodes kept;
    - with several requests per forward (a job's `generation.batch_size` > 1), `row_budget` cuts
      every round's trees further, to the rows the device's measured forward-time curve says pay
      for themselves (lp/decode/budget.py); a batch of one is never cut;
    - with several requests per forward, `prefix_reuse` starts a joining prompt's prefill after the
      longest prefix whose K/V a cache row of the batch already holds (lp/decode/prefix.py).
    """
    window: int = 15
    ngram: int = 5
    guesses: int = 15
    pool_seeding: bool = True  # seed the pool from the prompt and the committed output
    lookup_candidates: int = 0  # 0: no lookup candidates
    lookup_tokens: int = 10
    lookup_ngram: int = 3
    suffix_factor: float = 0.0  # 0: no suffix drafts
    suffix_tokens: int = 32
    suffix_min_score: float = 0.0
    job_cache: bool = False
    tree_budget: int = 0
    row_budget: bool = True
    prefix_reuse: bool = True

    @property
    def suffix(self) -> bool:
        return self.suffix_factor > 0

    @property
    def capacity(self) -> int:
        """Most tree nodes a round can verify (the size of the LP candidate broadcast)."""
        most = (self.guesses * (self.ngram - 1) + self.lookup_candidates * self.lookup_tokens
                + (self.suffix_tokens * (2 if self.job_cache else 1) if self.suffix else 0))
        return min(most, self.tree_budget) if self.tree_budget else most

    @property
    def width(self) -> int:
        """Deepest tree node a round can verify."""
        deepest = max(self.ngram - 1 if self.guesses else 0, self.lookup_tokens if self.lookup_candidates else 0,
                      self.suffix_tokens if self.suffix else 0, 1)
        return min(deepest, self.capacity) if self.capacity else 1

    def problems(self) -> list[str]:
        out = [f"lookahead.{key}: {getattr(self, key)!r} must be at most {MOST_COUNT}" for key in COUNT_KEYS
               if getattr(self, key) > MOST_COUNT]
        if self.window < 0:
            out.append(f"lookahead.window: {self.window!r} must be >= 0 (0: no Jacobi window)")
        for key in ("lookup_candidates", "lookup_tokens", "lookup_ngram", "suffix_tokens", "tree_budget"):
            low = 1 if key in ("lookup_tokens", "lookup_ngram", "suffix_tokens") else 0
            if getattr(self, key) < low:
                out.append(f"lookahead.{key}: {getattr(self, key)!r} must be >= {low}"
                           + (" (0: no cut)" if key == "tree_budget" else ""))
        if not (math.isfinite(self.suffix_factor) and self.suffix_factor >= 0):
            out.append(f"lookahead.suffix_factor: {self.suffix_factor!r} must be a finite number >= 0 "
                       f"(0: no suffix drafts)")
        if not 0 <= self.suffix_min_score <= 1:
            out.append(f"lookahead.suffix_min_score: {self.suffix_min_score!r} must be in [0, 1]")
        if self.ngram < 3:
            out.append(f"lookahead.ngram: {self.ngram!r} must be >= 3")
        if self.guesses < 0:
            out.append(f"lookahead.guesses: {self.guesses!r} must be >= 0")
        return out


@dataclass
class GenerationParams:
    """Config section `generation`."""
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    # how a job decodes: "lookahead" (this module) or "autoregressive" (transformers generate,
    # lp.baseline); lookahead_generate itself ignores it
    method: str = "lookahead"
    # 0: greedy; else sample with generate's warpers in its order: temperature, top_h, top_k, top_p, min_p,
    # typical_p, epsilon_cutoff, eta_cutoff (lp.decode.sampling.warpers)
    temperature: float = 0.0
    top_h: float = 0.0         # 0: off (generate's None); else keep the likeliest tokens up to top_h x entropy
    top_k: int = 0             # 0: off
    top_p: float = 1.0         # 1: off (0: the most likely token only, as generate keeps one)
    min_p: float = 0.0         # 0: off; else drop tokens below min_p x the most likely one's probability
    typical_p: float = 1.0     # 1: off; else locally typical sampling's mass
    epsilon_cutoff: float = 0.0    # 0: off; else drop tokens below this probability
    eta_cutoff: float = 0.0        # 0: off; else eta sampling's cutoff (entropy-scaled)
    seed: int = 0              # draws are a function of (seed, request, position)
    # generate's processors, before the warpers (lp/decode/processors.py): a token the input already
    # holds (prompt and output) has its score s made s * p when s < 0, else s / p (1: off); and no EOS
    # before this many new tokens (0: off)
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    # no token that would repeat an n-gram of this size the input holds (0: off); no token sequence of
    # these (a one-token word: that token, unless it is an EOS id) in the output
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    suppress_tokens: tuple[int, ...] = ()      # tokens never emitted (EOS ids included, as generate)
    begin_suppress_tokens: tuple[int, ...] = ()     # tokens the first new token never is (EOS ids included)
    forced_eos_token_id: tuple[int, ...] = ()   # the last new token (the max_new_tokens-th) is one of these
    # (token ids, bias): the bias is added to the score of the last token where the input ends with the
    # others (one token: always), before every other processor, as generate's sequence_bias
    sequence_bias: tuple[tuple[tuple[int, ...], float], ...] = ()
    # requests a job decodes per forward (lp.engine.decode_batch; 1: one at a time); lookahead_generate
    # decodes one request and ignores it
    batch_size: int = 1

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    def greedy(self) -> GenerationParams:
        """These parameters with every sampling warper off (what greedy decoding reads)."""
        return dataclasses.replace(self, **{k: f.default for k, f in _FIELDS.items() if k in WARPER_KEYS})

    def problems(self) -> list[str]:
        out = []
        if self.max_new_tokens < 1:
            out.append(f"generation.max_new_tokens: {self.max_new_tokens!r} must be >= 1")
        if self.method not in ("lookahead", "autoregressive"):
            out.append(f"generation.method: {self.method!r} must be one of lookahead, autoregressive")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            out.append(f"generation.temperature: {self.temperature!r} must be a finite number >= 0 (0 is greedy)")
        for key, interval in UNIT_INTERVALS.items():
            if not _inside(getattr(self, key), interval):
                out.append(f"generation.{key}: {getattr(self, key)!r} must be in {interval} "
                           f"({_FIELDS[key].default:g} is off)")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            out.append(f"generation.repetition_penalty: {self.repetition_penalty!r} must be a finite number > 0 "
                       f"(1 is off)")
        for key in ("suppress_tokens", "begin_suppress_tokens", "forced_eos_token_id"):
            if any(t < 0 for t in getattr(self, key)):
                out.append(f"generation.{key}: {list(getattr(self, key))!r} must be token ids >= 0")
        if self.forced_eos_token_id and set(self.forced_eos_token_id) <= set(self.suppress_tokens):
            out.append(f"generation.forced_eos_token_id: {list(self.forced_eos_token_id)!r} are all in "
                       f"suppress_tokens: the last token would have no score left (as generate refuses)")
        out += _sequence_bias_problems(self.sequence_bias)
        if any(not w or any(t < 0 for t in w) for w in self.bad_words_ids):
            out.append(f"generation.bad_words_ids: {[list(w) for w in self.bad_words_ids]!r} must be non-empty "
                       f"lists of token ids >= 0")
        for key, low, note in (("top_k", 0, " (0 is off)"), ("min_new_tokens", 0, " (0 is off)"),
                               ("no_repeat_ngram_size", 0, " (0 is off)"), ("seed", 0, ""), ("batch_size", 1, "")):
            if getattr(self, key) < low:
                out.append(f"generation.{key}: {getattr(self, key)!r} must be >= {low}{note}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            out.append(f"generation.stop: {list(self.stop)!r} must be non-empty strings")
        return out


_FIELDS = {f.name: f for f in dataclasses.fields(GenerationParams)}
# the sampling warpers' keys, in generate's order (greedy decoding reads none of them)
WARPER_KEYS = ("temperature", "top_h", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
# the warper knobs that are a fraction, with the interval generate's warper takes (its default: off)
UNIT_INTERVALS = {"top_h": "[0, 1]", "top_p": "[0, 1]", "min_p": "[0, 1]", "typical_p": "(0, 1]",
                  "epsilon_cutoff": "[0, 1)", "eta_cutoff": "[0, 1)"}


def _sequence_bias_problems(entries) -> list[str]:
    """Bad sequence_bias entries, and two multi-token ones that could complete at the same row on the same
    token (one's prefix ends the other's): generate sums their biases in its own order, which lp does not
    reproduce, so it refuses them."""
    out, seen = [], {}
    for ids, bias in entries:
        if not ids or any(t < 0 for t in ids) or math.isnan(bias):
            out.append(f"generation.sequence_bias: {[list(ids), bias]!r} must be non-empty token ids >= 0 and a "
                       f"number")
        elif tuple(ids) in seen:
            out.append(f"generation.sequence_bias: {list(ids)!r} appears twice")
        seen[tuple(ids)] = bias
    multi = [ids for ids in seen if len(ids) > 1]
    for i, a in enumerate(multi):
        for b in multi[i + 1:]:
            short, long = sorted((a, b), key=len)
            if a[-1] == b[-1] and long[:-1][len(long) - len(short):] == short[:-1]:
                out.append(f"generation.sequence_bias: {list(a)!r} and {list(b)!r} can complete on the same token "
                           f"at once; lp adds one multi-token bias per token and row")
    return out


def _inside(value: float, interval: str) -> bool:
    """Whether `value` lies in an interval written "[0, 1)" (0 and 1 only; NaN lies in none)."""
    low = 0 < value if interval[0] == "(" else 0 <= value
    return low and (value < 1 if interval[-1] == ")" else value <= 1)


def check(*params) -> None:
    problems = [p for ps in params for p in ps.problems()]
    if problems:
        raise ValueError("\n".join(problems))

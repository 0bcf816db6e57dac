"""lp as a library: lookahead decoding for code that already holds a transformers model.

    out = model.generate(ids, custom_generate=lp.lookahead, max_new_tokens=64)      # a generate drop-in
    results = lp.generate(model, ["def f(x):", "class A:"], tokenizer=tokenizer)     # a plain function

`lookahead` is a `custom_generate` callable: transformers' `generate` prepares the inputs and the
generation config (the model's own `generation_config` merged with the call's arguments) and hands the
decoding loop to it. It honours `max_new_tokens` / `max_length`, `eos_token_id`, `pad_token_id`,
`do_sample` with `temperature` / `top_h` / `top_k` / `top_p` / `min_p` / `typical_p` / `epsilon_cutoff` /
`eta_cutoff`, `repetition_penalty`, `no_repeat_ngram_size`, `bad_words_ids`, `suppress_tokens`,
`begin_suppress_tokens`, `sequence_bias`, `forced_eos_token_id`, `min_new_tokens` / `min_length`, any
other logits processor that treats each row on its own (`prefix_allowed_tokens_fn`,
`exponential_decay_length_penalty`, a user's `logits_processor`: called on every verified row with that
row's own input ids, lp.decode.processors.process_by_input), `return_dict_in_generate` (`sequences` only) and a
batch of left-padded prompts (each row decoded on its own, the rows padded on the right with
`pad_token_id` as `generate` pads finished rows). lp's own keys are keyword arguments with the job
config's names and defaults (`window`, `ngram`, ..., `suffix_factor`: `lp.jobs.config.JOB_LOOKAHEAD`),
and `batch_size`, the rows decoded per forward (1: one at a time).
What it cannot do exactly it refuses, naming the option: beam search, assisted decoding, logits
processors that read more than their own rows (guidance, the encoder processors) or that generate orders
where lp cannot, stopping criteria that read the time or the scores, scores or hidden states in the
output. Other stopping criteria (a `StopStringCriteria`, your own) are tested after each committed token
on the row's input ids, with no scores, and end the row where generate's would.

transformers 5.17-5.24 do not pass `streamer`, `tokenizer` or `assistant_model` to a callable
`custom_generate` (they keep them for their own decoding methods): `lookahead` reads the streamer and the
assistant model off the `generate` call that called it (`_generate_call`), so a `TextStreamer` prints
what it prints with `generate`, and an assistant model is refused; `stop_strings` cannot reach it
(transformers refuses them without the tokenizer before it calls `lookahead`): a StopStringCriteria in
`stopping_criteria` does, and `generate` below takes them.

`generate` decodes one prompt or many (text with a tokenizer, or token ids), with stop strings, a
streamer that receives each round's committed tokens as the round commits them, and several prompts
per forward (`batch_size`, as a job's), and returns one `GenerationResult` per prompt (token ids,
text, finish reason, forwards, S). Both draft from the call's earlier completions, as a job does.

Greedy output is identical to `model.generate(do_sample=False)`; sampled output is distributed as
`generate`'s sampling (its draws are lp's, seeded from `seed`, or in the drop-in from torch's global
generator, so `torch.manual_seed` makes a call reproducible).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import sys
import threading
import time
import warnings
import weakref
from typing import Mapping, Sequence

import torch
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

from lp.decode.arch import check_model, input_vocab, outside_vocabulary, rope_switches_once, rope_threshold
from lp.decode.kv_cache import given_cache_tokens
from lp.decode.params import WARPER_KEYS, GenerationParams, LookaheadParams, check
from lp.decode.processors import RowProcessor, SeenPrompt, as_generate_calls
from lp.decode.propose import job_cache as completions_index    # `job_cache` is a keyword here
from lp.decode.stopping import StopTest
from lp.engine import GenerationResult, Prompt, decode_batch, lookahead_generate
from lp.hf_processing import (PerRequest, bias_entries, no_op, read_criteria, read_processors, replayed_forcing,
                              is_token_id, row_processor_of, row_wise, stop_test, token_ids)
from lp.jobs.config import JOB_LOOKAHEAD, check_types, close_key
from lp.measure.cost_model import budget_kwargs, row_costs
from lp.messages import short_repr

logger = logging.getLogger("lp.library")
LOOKAHEAD_KEYS = tuple(f.name for f in dataclasses.fields(LookaheadParams))
# generation config options that ask for another decoding than lookahead's (each of generate's generation
# modes but greedy and sampling: GenerationConfig.get_generation_mode), or for more output than ids:
# (name, whether its value (and the config) asks for it, what); an output flag without
# return_dict_in_generate asks for nothing (generate ignores it), nor does penalty_alpha 0
_OUTPUTS = lambda v, c: bool(v) and bool(c.return_dict_in_generate)  # noqa: E731
_REFUSED_OPTIONS = (("num_beams", lambda v, c: v not in (None, 1), "beam search"),
                    ("num_return_sequences", lambda v, c: v not in (None, 1), "several sequences per prompt"),
                    ("penalty_alpha", lambda v, c: v is not None and v > 0, "contrastive search"),
                    ("prompt_lookup_num_tokens", lambda v, c: v is not None, "prompt lookup (assisted) decoding"),
                    ("assistant_early_exit", lambda v, c: v is not None, "early-exit (assisted) decoding"),
                    ("use_mtp", lambda v, c: bool(v), "multi-token prediction (assisted) decoding"),
                    ("force_words_ids", lambda v, c: v is not None, "constrained beam search"),
                    ("constraints", lambda v, c: v is not None, "constrained beam search"),
                    ("dola_layers", lambda v, c: v is not None, "DoLa decoding"),
                    ("output_scores", _OUTPUTS, "scores in the output"),
                    ("output_logits", _OUTPUTS, "logits in the output"),
                    ("output_attentions", _OUTPUTS, "attentions in the output"),
                    ("output_hidden_states", _OUTPUTS, "hidden states in the output"))
# what generate itself puts into the model keyword arguments it hands a custom_generate (and the output
# flags, checked above); any other model input (token_type_ids, pixel_values, ...) is one lp would not feed
_GENERATE_MODEL_KWARGS = frozenset({"attention_mask", "cache", "past_key_values", "use_cache", "logits_to_keep",
                                    "position_ids", "cache_position", "inputs_embeds", "output_attentions",
                                    "output_hidden_states"})


def lookahead_params(**keys) -> LookaheadParams:
    """The job config's lookahead section (JOB_LOOKAHEAD) with `keys` over it; TypeError for a key lp does
    not have, ValueError for a value out of range."""
    unknown = sorted(set(keys) - set(LOOKAHEAD_KEYS))
    if unknown:
        knobs = [k for k in inspect.signature(generate).parameters if k not in ("model", "prompts", "lookahead_keys")]
        named = [k + (f" (did you mean {close}?)" if (close := close_key(k, [*LOOKAHEAD_KEYS, *knobs])) else "")
                 for k in unknown]
        raise TypeError(f"unknown lookahead option(s) {', '.join(named)}; lp's are {', '.join(LOOKAHEAD_KEYS)}")
    values, problems = check_types("lookahead", LookaheadParams, keys)     # the job config's own kinds check
    if problems:
        raise ValueError("\n".join(problems))
    params = LookaheadParams(**{**JOB_LOOKAHEAD, **values})
    check(params)
    return params


def lookahead(model, input_ids: torch.LongTensor, logits_processor=None, stopping_criteria=None,
              generation_config=None, synced_gpus: bool = False, streamer=None, *,
              window: int = JOB_LOOKAHEAD["window"], ngram: int = JOB_LOOKAHEAD["ngram"],
              guesses: int = JOB_LOOKAHEAD["guesses"], pool_seeding: bool = JOB_LOOKAHEAD["pool_seeding"],
              lookup_candidates: int = JOB_LOOKAHEAD["lookup_candidates"],
              lookup_tokens: int = JOB_LOOKAHEAD["lookup_tokens"], lookup_ngram: int = JOB_LOOKAHEAD["lookup_ngram"],
              suffix_factor: float = JOB_LOOKAHEAD["suffix_factor"],
              suffix_tokens: int = JOB_LOOKAHEAD["suffix_tokens"],
              suffix_min_score: float = JOB_LOOKAHEAD["suffix_min_score"],
              job_cache: bool = JOB_LOOKAHEAD["job_cache"], tree_budget: int = 0,
              row_budget: bool = True, prefix_reuse: bool = True, batch_size: int = 1, **model_kwargs):
    """`model.generate(..., custom_generate=lp.lookahead)`: transformers calls this with the prepared
    inputs (module docstring). Returns what `generate` returns: prompt + new ids, [batch, length].
    `batch_size` > 1 decodes up to that many of the batch's rows per forward, as lp.generate does."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    check_model(model)      # first: generate's inputs for a model lp refuses (a recurrent cache) would be named
    caller = _generate_call()
    if caller.get("assistant_model") is not None:
        raise ValueError("lp.lookahead drafts without an assistant model: drop assistant_model")
    streamer = streamer if streamer is not None else caller.get("streamer")
    config = generation_config if generation_config is not None else model.generation_config
    for key, asks, what in _REFUSED_OPTIONS:
        value = getattr(config, key, None)
        value = model_kwargs.get(key) if value is None else value     # 5.25 passes some output flags there
        if asks(value, config):
            raise ValueError(f"lp.lookahead cannot do {what} ({key}={value!r})")
    if getattr(config, "stop_strings", None):
        raise ValueError("lp.lookahead gets no tokenizer from generate, so it cannot apply stop_strings: "
                         "use lp.generate(..., stop_strings=..., tokenizer=...)")
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids; got {input_ids.dtype}")
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError("lp.lookahead decodes from input_ids: inputs_embeds is not supported")
    if given_cache_tokens(model_kwargs):
        raise ValueError("lp.lookahead builds its own cache from input_ids: pass the whole sequence as input_ids "
                         "and no past_key_values")
    extra = sorted(k for k, v in model_kwargs.items()      # an empty container passes nothing (Gemma 3's
                   if v is not None and not (isinstance(v, (dict, list, tuple)) and not v)   # mm_encoder_outputs)
                   and k not in _GENERATE_MODEL_KWARGS)
    if extra:
        raise ValueError(f"lp.lookahead feeds the model input_ids (and their positions) only: it cannot pass "
                         f"{', '.join(extra)} to the model")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and tuple(mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(input_ids.shape)}: one mask "
                         f"value per token")
    _check_positions(model_kwargs.get("position_ids"), mask, input_ids)
    eos = token_ids(config.eos_token_id, "generation_config.eos_token_id")
    processing, ignored, custom = read_processors(
        [p for p in logits_processor or [] if not no_op(p, input_ids.shape[1])], bool(config.do_sample),
        input_ids.shape, eos)
    new, ends, stop_when = read_criteria(stopping_criteria, config, processing, input_ids.shape, input_ids.device)
    params = lookahead_params(window=window, ngram=ngram, guesses=guesses, pool_seeding=pool_seeding,
                              lookup_candidates=lookup_candidates, lookup_tokens=lookup_tokens,
                              lookup_ngram=lookup_ngram, suffix_factor=suffix_factor, suffix_tokens=suffix_tokens,
                              suffix_min_score=suffix_min_score, job_cache=job_cache, tree_budget=tree_budget,
                              row_budget=row_budget, prefix_reuse=prefix_reuse)
    if "forced_eos_token_id" in processing:      # (ids, the max_length it forces them at)
        processing["forced_eos_token_id"], length = processing["forced_eos_token_id"]
        if length != input_ids.shape[1] + new:
            raise ValueError(f"lp.lookahead forces forced_eos_token_id as the last new token (max_length "
                             f"{input_ids.shape[1] + new}); ForcedEOSTokenLogitsProcessor forces it at max_length "
                             f"{length}")
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    sizes, problems = check_types("lookahead", GenerationParams, {"batch_size": batch_size})
    if problems:
        raise ValueError("\n".join(problems))
    generation = GenerationParams(new, **processing, **sizes)
    check(generation)
    if mask is not None:
        _check_left_padding(mask, pad)
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError(f"lp.lookahead streams one row: a streamer with a batch of {input_ids.shape[0]} rows is "
                         f"not supported")
    prompts, seen = [], []
    for b in range(input_ids.shape[0]):
        row = input_ids[b]
        prompts.append((row[mask[b].bool()] if mask is not None else row).tolist())     # left padding stripped
        seen.append(SeenPrompt(row.tolist(), ignored[b] if ignored is not None else 0))  # what the processors see
    _check_no_shared_rope(model.config, [len(p) for p in prompts], new)
    _check_inputs(model, prompts)
    if generation.temperature > 0:      # drawn once every check passed: a refused call leaves the generator alone
        generation = dataclasses.replace(generation, seed=draw_seed())
    rows = [r.token_ids for r in _decode(model, prompts, params, generation, ends, None, streamer,
                                         generation.batch_size, seen, row_processor_of(custom), stop_when)]
    longest = max(len(r) for r in rows)
    tail = torch.full((input_ids.shape[0], longest), pad, dtype=torch.long, device=input_ids.device)
    for b, ids in enumerate(rows):
        tail[b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    sequences = torch.cat([input_ids.long(), tail], dim=1)       # int64, as generate returns whatever came in
    if config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def generate(model, prompts: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]], *, tokenizer=None,
             max_new_tokens: int = 256, eos_token_id: int | Sequence[int] | None = None,
             stop_strings: str | Sequence[str] = (), do_sample: bool = False, temperature: float = 1.0,
             top_h: float = 0.0, top_k: int = 50, top_p: float = 1.0, min_p: float = 0.0, typical_p: float = 1.0,
             epsilon_cutoff: float = 0.0, eta_cutoff: float = 0.0, repetition_penalty: float = 1.0,
             min_new_tokens: int = 0, no_repeat_ngram_size: int = 0, bad_words_ids: Sequence[Sequence[int]] = (),
             suppress_tokens: Sequence[int] = (), begin_suppress_tokens: Sequence[int] = (),
             sequence_bias: Mapping | Sequence = (), forced_eos_token_id: int | Sequence[int] = (), seed: int = 0,
             prefix_allowed_tokens_fn=None, logits_processor: Sequence = (), stopping_criteria: Sequence = (),
             streamer=None, batch_size: int = 1,
             **lookahead_keys) -> list[GenerationResult]:
    """Decode each prompt (text, with `tokenizer`; or token ids) with lookahead; one result per prompt.
    The knobs are generate's, with generate's own defaults (so sampling keeps the top 50 tokens unless
    `top_k` says otherwise; None turns a knob off, as for generate, and draws `seed` from torch's global
    generator), not the model's generation config's
    (the drop-in reads those); `repetition_penalty` counts each prompt's tokens, as generate's does.
    `eos_token_id` defaults to the model's generation config; `stop_strings` need `tokenizer` and match
    the decoded new text (not across the prompt's end, nor special tokens' text, unlike generate's);
    `prefix_allowed_tokens_fn` (batch id: the prompt's index) and `logits_processor` (after the knobs'
    processors, before the warpers, as generate merges a custom list) are called row by row, exact for
    processors that treat each row on its own; `stopping_criteria` are tested after each committed token on
    the prompt and output (no scores), as the drop-in tests them; a
    `streamer` (one prompt only, as generate's) gets the prompt, then each round's committed tokens.
    lp's own options are keyword arguments with the job config's names and defaults. As in a job, each
    prompt drafts from the call's earlier completions too (`job_cache`), and `batch_size` > 1 decodes up
    to that many prompts per forward with continuous batching (lp.engine.decode_batch), each round's
    trees cut to the rows that pay on this device (`row_budget`: its costs measured at the first such
    call on a model, then kept); the ids are the same at every batch size."""
    params = lookahead_params(**lookahead_keys)
    batch = _prompt_list(prompts, tokenizer)
    if streamer is not None and len(batch) != 1:
        raise ValueError(f"a streamer takes one prompt at a time (as generate's); got {len(batch)} prompts")
    if stop_strings is None:
        stop_strings = ()
    elif isinstance(stop_strings, str):        # one stop string, as generate takes it
        stop_strings = (stop_strings,)
    elif isinstance(stop_strings, (list, tuple, set, frozenset)) and all(isinstance(s, str) for s in stop_strings):
        stop_strings = tuple(stop_strings)
    else:
        raise ValueError(f"generate.stop_strings must be a string or a list of strings; got "
                         f"{short_repr(stop_strings, 60)}")
    if not all(stop_strings):
        raise ValueError(f"generate.stop_strings must be non-empty strings; got {list(stop_strings)!r}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings are matched on decoded text: pass the tokenizer")
    if max_new_tokens is None:
        raise ValueError("generate.max_new_tokens: None; lp.generate needs the number of new tokens (it takes no "
                         "max_length)")
    # unseeded: a seed from torch's global generator, as the drop-in draws (torch.manual_seed), once every
    # check passed (a refused call leaves the generator as it was, as generate's do)
    drawn, seed = (do_sample, 0) if seed is None else (False, seed)
    given = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_h=top_h, top_k=top_k, top_p=top_p,
                 min_p=min_p, typical_p=typical_p, epsilon_cutoff=epsilon_cutoff, eta_cutoff=eta_cutoff, seed=seed,
                 repetition_penalty=repetition_penalty, min_new_tokens=min_new_tokens,
                 no_repeat_ngram_size=no_repeat_ngram_size, bad_words_ids=bad_words_ids,
                 suppress_tokens=_ids_or_none(suppress_tokens, "generate.suppress_tokens"),
                 begin_suppress_tokens=_ids_or_none(begin_suppress_tokens, "generate.begin_suppress_tokens"),
                 sequence_bias=bias_entries(sequence_bias or ()),
                 forced_eos_token_id=token_ids(forced_eos_token_id, "generate.forced_eos_token_id"),
                 batch_size=batch_size)
    defaults = inspect.signature(generate).parameters
    # None is off, as generate reads an explicit None: each knob's default, which is off but for top_k's
    # (generate's own default, top-50)
    raw, given = given, {k: (0 if k == "top_k" else defaults[k].default) if v is None else v for k, v in given.items()}
    knobs, problems = check_types("generate", GenerationParams, given)     # the job config's own kinds check
    if problems:
        raise ValueError("\n".join(problems))
    if do_sample and not knobs["temperature"] > 0:
        raise ValueError(f"do_sample=True needs a temperature > 0 (got {temperature!r}); do_sample=False is greedy")
    generation = GenerationParams(**knobs, stop=tuple(stop_strings))
    if not do_sample:
        generation = generation.greedy()       # generate reads no warper either
        unused = [f"{k}={raw[k]!r}" for k in WARPER_KEYS if raw[k] not in (None, defaults[k].default)]
        if unused:       # generate warns so too
            warnings.warn(f"lp.generate decodes greedily (do_sample=False): {', '.join(unused)} only apply when "
                          f"sampling; set do_sample=True or leave them out", UserWarning, stacklevel=2)
    check(generation)
    eos = token_ids(eos_token_id, "generate.eos_token_id") if eos_token_id is not None else \
        token_ids(model.generation_config.eos_token_id, "generation_config.eos_token_id")
    custom = [row_wise(p) for p in _listed(logits_processor, "logits_processor")]
    device = next(model.parameters()).device
    if prefix_allowed_tokens_fn is not None:
        if not callable(prefix_allowed_tokens_fn):
            raise ValueError(f"prefix_allowed_tokens_fn must be a function (batch_id, input_ids) -> allowed token "
                             f"ids; got {short_repr(prefix_allowed_tokens_fn, 60)}")
        custom.insert(0, PrefixConstrainedLogitsProcessor(prefix_allowed_tokens_fn, 1))
        if generation.forced_eos_token_id:      # generate forces the EOS after the constraint: replayed after it
            custom.insert(1, PerRequest(lambda key: replayed_forcing(len(batch[key]), generation, device)))
    stop_when = stop_test(_listed(stopping_criteria, "stopping_criteria"), device)
    check_model(model)
    _check_inputs(model, batch)
    if drawn:
        generation = dataclasses.replace(generation, seed=draw_seed())
    if streamer is not None:
        with as_generate_calls():
            streamer.put(torch.tensor(batch))
    results = _decode(model, batch, params, generation, eos, tokenizer, streamer, generation.batch_size,
                      row_processor=row_processor_of(custom), stop_when=stop_when)
    return results          # with a tokenizer each has its text (its StopChecker's)


def _decode(model, prompts: list[list[int]], params: LookaheadParams, generation: GenerationParams, eos: list[int],
            tokenizer, streamer, batch_size: int, seen: list[SeenPrompt] | None = None,
            row_processor: RowProcessor | None = None, stop_when: StopTest | None = None) -> list[GenerationResult]:
    """Every prompt decoded (the k-th as request k, with key k, `seen[k]` what generate's processors see of
    it, `row_processor` the processors called row by row, `stop_when` the stopping criteria tested after
    each committed token), one result each in prompt order: each drafts
    from the completions that ended before it starts (the call's job cache), and with `batch_size` > 1 up
    to that many share each forward, with the row budget where `params` asks for it."""
    with _model_lock(model):      # calls from other threads wait: they would share the kept caches
        corpus = completions_index(params)
        seen = seen or [None] * len(prompts)
        width = min(batch_size, len(prompts))
        if width > 1:
            costs = _row_costs(model, params, width, prompts) if params.row_budget else None
            requests = (Prompt(k, ids, k, s) for k, (ids, s) in enumerate(zip(prompts, seen)))
            outcomes = decode_batch(model, requests, params, generation, batch_size=width,
                                    prompt_tokens=max(map(len, prompts)), eos_token_ids=eos, tokenizer=tokenizer,
                                    corpus=corpus, row_processor=row_processor, stop_when=stop_when,
                                    **budget_kwargs(costs))
        else:
            outcomes = ((k, lookahead_generate(model, ids, params, generation, eos_token_ids=eos, tokenizer=tokenizer,
                                               request=k, streamer=streamer, seen_prompt=s, corpus=corpus,
                                               row_processor=row_processor, stop_when=stop_when))
                        for k, (ids, s) in enumerate(zip(prompts, seen)))
        out: dict[int, GenerationResult] = {}
        with contextlib.closing(outcomes):     # a raise below closes decode_batch (its heap_frozen thaws)
            for k, r in outcomes:         # in the order they end; each completion joins the corpus then
                if isinstance(r, Exception):      # as generate raises for the whole batch
                    raise r
                if corpus is not None and r.token_ids:
                    corpus.add(r.token_ids)
                out[k] = r
        return [out[k] for k in range(len(prompts))]


_LOCKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> the lock its calls take
_LOCKS_MADE = threading.Lock()


def _model_lock(model) -> threading.RLock:
    """The lock that runs calls on `model` from several threads one at a time: a decode writes the K/V
    cache and the row-cost grid kept on the model while it runs, and a call from another thread would
    take them too. Re-entrant: a call from a callback of another, on its thread, goes on (with a cache
    of its own: lp.decode.kv_cache.round_cache)."""
    with _LOCKS_MADE:
        return _LOCKS.setdefault(model, threading.RLock())


_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> {(batch, lookahead): row costs}


def _row_costs(model, params: LookaheadParams, batch_size: int, prompts: list[list[int]]) -> dict:
    """The row budget's costs for `model` (lp.measure.cost_model.row_costs), measured at its first
    batched call with these sizes (and its dtype and device) and kept with the model for the next ones."""
    param = next(model.parameters())
    key = (batch_size, dataclasses.astuple(params), param.dtype, param.device)
    kept = _COSTS.setdefault(model, {})
    if key not in kept:
        t0 = time.perf_counter()
        kept[key] = row_costs(model, params, batch_size, prompts)
        logger.info("row budget: %d forward times and the drafting measured in %.1f s (once per model and sizes)",
                    len(kept[key]["curve"]), time.perf_counter() - t0)
    return kept[key]


def _generate_call(depth: int = 8) -> dict:
    """The arguments of the `generate` call that led to `lookahead` (its frame's locals): the nearest
    `generate` frame with a `custom_generate` among the `depth` frames above lookahead's, so a user's
    function that wraps lp.lookahead as the custom_generate finds it too; {} when there is none.
    transformers 5.17-5.24 keep `streamer` and `assistant_model` from a callable `custom_generate`; this is
    where lookahead finds them (generate has already put the prompt into the streamer by then)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            break
        if frame.f_code.co_name == "generate" and "custom_generate" in frame.f_locals:
            return {k: frame.f_locals.get(k) for k in ("streamer", "assistant_model")}
        frame = frame.f_back
    return {}



def _check_no_shared_rope(config, lengths: list[int], new: int) -> None:
    """Refuse a padded batch whose rows generate decodes together where lp decodes each alone. A RoPE
    that follows the largest position in a forward ("dynamic", "longrope": lp.decode.arch.rope_threshold T)
    is one RoPE for all of generate's rows: once its longest row reaches position T (its forwards hold
    positions up to longest + new - 2), a shorter row's ids are no longer those it has alone, which are
    lp's. Rows of one length share every position and stay exact, and so does a batch under a RoPE that
    only switches at T ("longrope") whose rows all start past T (every forward of theirs is on the far side
    alone too)."""
    threshold = rope_threshold(config)
    if threshold is None or len(set(lengths)) < 2 or max(lengths) + new - 2 < threshold:
        return
    if rope_switches_once(config) and min(lengths) > threshold:
        return
    raise ValueError(f"lp.lookahead decodes each row of a batch on its own; this model's RoPE follows the largest "
                     f"position of a forward from position {threshold} on, so generate's padded batch (rows of "
                     f"{min(lengths)} to {max(lengths)} tokens, {new} new) rescales its shorter rows by the "
                     f"longest one's position, and no row-by-row decoding gives those ids: pass rows of one "
                     f"length, or one row per call (lp.generate decodes each prompt as generate does alone)")


def _check_left_padding(mask: torch.Tensor | list[list[int]], pad: int | None = None) -> None:
    """Each row of `mask` (a tensor or lists) is zeros then ones (left padding, as lp strips it), with at
    least one token. `pad`: the drop-in's pad_token_id (without a mask from the caller, generate builds one
    that masks every pad_token_id)."""
    rows = mask.bool().tolist() if isinstance(mask, torch.Tensor) else [[bool(v) for v in r] for r in mask]
    for b, row in enumerate(rows):
        start = row.index(True) if True in row else None
        if start is None:
            raise ValueError(f"attention_mask row {b} masks every token: nothing to decode")
        if not all(row[start:]):
            inside = row.index(False, start)
            generated = "" if pad is None else (
                f". Without an attention_mask, generate masks every pad_token_id ({pad}): a prompt that holds it "
                f"needs an attention_mask of ones")
            raise ValueError(f"attention_mask row {b} masks position {inside}, after a kept token: lp strips left "
                             f"padding only; pad on the left (tokenizer.padding_side = 'left'){generated}")


def _check_positions(position_ids, mask, input_ids: torch.Tensor) -> None:
    """lp numbers a row's kept tokens 0, 1, ...: position_ids other than generate's own (from the mask,
    or 0..length-1) are refused."""
    if position_ids is None:
        return
    if tuple(position_ids.shape[-1:]) != tuple(input_ids.shape[-1:]):
        raise ValueError(f"position_ids have shape {tuple(position_ids.shape)}, input_ids {tuple(input_ids.shape)}: "
                         f"one position per token (generate numbers them from the attention_mask: check its "
                         f"shape)")
    if mask is not None:
        default = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    else:
        default = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    try:
        given, default = torch.broadcast_tensors(position_ids.to(default.device), default)
    except RuntimeError:
        given = None
    if given is None or not torch.equal(given, default):
        raise ValueError("lp.lookahead numbers each prompt's tokens from 0 (after left padding): it cannot take "
                         "other position_ids")



def _listed(value, name: str) -> list:
    """A list option (logits_processor, stopping_criteria) as a list; TypeError naming it for anything but a
    list or tuple (generate's LogitsProcessorList and StoppingCriteriaList are lists)."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"generate.{name} must be a list; got {short_repr(value, 60)} (one object: pass [it])")
    return list(value)


def _check_inputs(model, prompts: list[list[int]]) -> None:
    """ValueError for a prompt id past the model's embedding, before the call draws its seed or measures
    the row budget's grid with the model's forwards (the decode refuses it too, after). Callers check the
    model itself (lp.decode.arch.check_model) before this."""
    vocab = input_vocab(model)
    for ids in prompts:
        if (why := outside_vocabulary(ids, vocab)) is not None:
            raise ValueError(why)


def draw_seed() -> int:
    """A sampling seed from torch's global generator (so torch.manual_seed makes a call reproducible)."""
    return int(torch.randint(0, 2**62, (1,)).item())


def _ids_or_none(value, name: str) -> tuple[int, ...] | None:
    """A token-id list option as a tuple (token_ids' forms), None left for the knob's default."""
    return None if value is None else tuple(token_ids(value, name))


def _prompt_list(prompts, tokenizer) -> list[list[int]]:
    """The prompts as lists of ids: a string or a list of strings (with the tokenizer); ids as a list, a
    1-D or 2-D tensor or array, or a list of those; or a tokenizer's output (input_ids with its
    attention_mask: left padding stripped)."""
    if isinstance(prompts, Mapping):
        if "input_ids" not in prompts:
            raise ValueError(f"prompts given as a mapping need input_ids (a tokenizer's output); got the keys "
                             f"{', '.join(map(str, prompts))}")
        rows = [_ids_of(r) for r in _rows(prompts["input_ids"])]
        if prompts.get("attention_mask") is not None:
            mask = [_ids_of(r) for r in _rows(prompts["attention_mask"])]
            if [len(m) for m in mask] != [len(ids) for ids in rows]:
                raise ValueError(f"attention_mask has rows of lengths {[len(m) for m in mask]}, input_ids "
                                 f"{[len(ids) for ids in rows]}: one mask value per token")
            _check_left_padding(mask)
            rows = [ids[len(ids) - sum(m):] for ids, m in zip(rows, mask)]
        prompts = rows
    out = []
    for p in ([prompts] if isinstance(prompts, str) else _rows(prompts)):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("text prompts need the tokenizer (tokenizer=...)")
            p = tokenizer.encode(p)
        ids = _ids_of(p)
        if not ids:
            raise ValueError("a prompt is empty: lookahead needs at least one prompt token")
        out.append(ids)
    if not out:
        raise ValueError("no prompts given")
    return out


def _rows(prompts) -> list:
    """One prompt's ids (a flat sequence of ints) as a list of one; a 2-D tensor or array as its rows;
    any other sequence as its items."""
    if hasattr(prompts, "tolist") and not isinstance(prompts, (list, tuple)):
        prompts = prompts.tolist()
    if isinstance(prompts, (str, int)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a string, token ids or a list of either; got {type(prompts).__name__}")
    prompts = list(prompts)
    return [prompts] if prompts and is_token_id(prompts[0]) else prompts


def _ids_of(prompt) -> list[int]:
    """One prompt's token ids from a list, a 1-D tensor or array, or a [1, n] one."""
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, Sequence) and len(prompt) == 1 and isinstance(prompt[0], Sequence):
        prompt = prompt[0]       # a [1, n] row, as a tokenizer returns one prompt
    if not isinstance(prompt, Sequence) or isinstance(prompt, str) or not all(is_token_id(t) for t in prompt):
        raise ValueError(f"a prompt must be text or a flat sequence of token ids; got {short_repr(prompt, 60)}")
    return [int(t) for t in prompt]

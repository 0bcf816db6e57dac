"""How lp reads the processing transformers' `generate` builds: its logits processors and sampling warpers
(which GenerationParams knobs they are, lp/decode/processors.py and lp/decode/sampling.py applying them;
which lp calls row by row as a RowProcessor, lp.decode.processors.process_by_input; which it refuses) and
its stopping criteria (lp's own max_length and EOS, the others as a StopTest tested after each committed
token, those that read the time or the scores refused). lp/library.py's two entry points use it:
`lookahead` on the processors generate prepared, `generate` on the same knobs given by name."""
from __future__ import annotations

import numbers
from typing import Mapping, NamedTuple, Sequence

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)
from transformers.generation.configuration_utils import GenerationConfig
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from lp.decode.processors import RowProcessor, as_generate_calls, plain
from lp.decode.stopping import StopTest
from lp.messages import short_repr

# generate's sampling warpers in its order (lp.decode.params.WARPER_KEYS): the GenerationParams field each
# sets and its value there
_WARPERS = {TemperatureLogitsWarper: ("temperature", lambda p: float(p.temperature)),
            TopHLogitsWarper: ("top_h", lambda p: float(p.top_h)),
            TopKLogitsWarper: ("top_k", lambda p: int(p.top_k)),
            TopPLogitsWarper: ("top_p", lambda p: float(p.top_p)),
            MinPLogitsWarper: ("min_p", lambda p: float(p.min_p)),
            TypicalLogitsWarper: ("typical_p", lambda p: float(p.mass)),
            EpsilonLogitsWarper: ("epsilon_cutoff", lambda p: float(p.epsilon)),
            EtaLogitsWarper: ("eta_cutoff", lambda p: float(p.epsilon))}     # a float32 tensor: its value exactly
# generate's processors lp applies (lp/decode/processors.py), before any cutting warper
_APPLIED = (SequenceBiasLogitsProcessor, RepetitionPenaltyLogitsProcessor, NoRepeatNGramLogitsProcessor,
            NoBadWordsLogitsProcessor, SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor,
            MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, ForcedEOSTokenLogitsProcessor)
_STOPS = (MaxLengthCriteria, EosTokenCriteria)     # generate's criteria lp applies itself (max_new_tokens, EOS)
# stopping criteria that read more than a row's input ids: the time, or the scores lp does not keep per token
_NOT_ID_STOPS = frozenset({"MaxTimeCriteria", "ConfidenceCriteria"})
# generate's processors that read more than a row's own input ids and scores (the batch's other rows, the
# encoder's input, the model, their own earlier calls): lp cannot call them row by row
_NOT_ROW_WISE = frozenset({"UnbatchedClassifierFreeGuidanceLogitsProcessor", "ClassifierFreeGuidanceLogitsProcessor",
                           "EncoderRepetitionPenaltyLogitsProcessor", "EncoderNoRepeatNGramLogitsProcessor",
                           "HammingDiversityLogitsProcessor", "SynthIDTextWatermarkLogitsProcessor",
                           "WhisperTimeStampLogitsProcessor", "WhisperNoSpeechDetection"})
# lp's own processors that commute with a prefix_allowed_tokens_fn (-inf fills both): generate applies them
# after it, lp before
_COMMUTE_WITH_PREFIX = (SuppressTokensLogitsProcessor, SuppressTokensAtBeginLogitsProcessor)
# lp's own processors that it also replays row by row after a prefix_allowed_tokens_fn: the forced EOS
# overwrites every score generate's constraint left (lp's forcing came before the constraint), and the
# suppressions after it then take their ids out again
_REPLAYED = (ForcedEOSTokenLogitsProcessor, *_COMMUTE_WITH_PREFIX)
# the generate option behind each logits processor or stopping criterion lp refuses, for its message
_OPTION_OF = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty", "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "NoBadWordsLogitsProcessor": "bad_words_ids", "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id", "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "SequenceBiasLogitsProcessor": "sequence_bias", "MinLengthLogitsProcessor": "min_length or min_new_tokens",
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens", "LogitNormalization": "renormalize_logits",
    "MinPLogitsWarper": "min_p", "TypicalLogitsWarper": "typical_p", "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff", "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "EncoderNoRepeatNGramLogitsProcessor": "encoder_no_repeat_ngram_size",
    "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty",
    "InfNanRemoveLogitsProcessor": "remove_invalid_values", "MaxTimeCriteria": "max_time",
    "StopStringCriteria": "stop_strings",
}


def _named(obj) -> str:
    """A processor's or criterion's class, with the generate option that made it where there is one."""
    name = type(obj).__name__
    return f"{name} ({_OPTION_OF[name]})" if name in _OPTION_OF else name


def no_op(processor, length: int) -> bool:
    """Whether a processor generate built never changes a score when decoding from `length` input ids (the
    prompt with its padding): min_new_tokens=0, a min_length the prompt already has, an empty
    suppress_tokens, min_p=0, no eos token to hold back, a forced BOS after the first token, or
    renormalize_logits (generate's last processor: a log-softmax, which moves neither the argmax nor
    the distribution)."""
    name = type(processor).__name__
    eos = getattr(processor, "eos_token_id", None)
    if name in ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor") and eos is not None \
            and torch.as_tensor(eos).numel() == 0:
        return True
    if name == "MinLengthLogitsProcessor":
        return processor.min_length <= length
    if name == "MinNewTokensLengthLogitsProcessor":
        return processor.min_new_tokens <= 0 or processor.prompt_length_to_skip + processor.min_new_tokens <= length
    if name == "LogitNormalization":
        return True
    if name == "ForcedBOSTokenLogitsProcessor":
        return length > 1
    if name == "MinPLogitsWarper":
        return float(processor.min_p) == 0.0
    if name == "SuppressTokensLogitsProcessor":
        return processor.suppress_tokens.numel() == 0
    if name == "SuppressTokensAtBeginLogitsProcessor":
        return processor.begin_suppress_tokens.numel() == 0 or processor.begin_index < length
    return False


def read_processors(processors, do_sample: bool, shape: tuple[int, int],
                    eos: list[int]) -> tuple[dict, list[int] | None, list]:
    """GenerationParams' sampling and processor fields from generate's prepared processors, where each
    row's repetition penalty starts (its input_ids' index: None, no penalty), and the processors lp
    calls row by row. Takes the processors lp applies (_APPLIED; a length processor on the config's eos
    ids, a sequence bias first) before any cutting warper, then any other processor that treats each
    row on its own (called row by row after those: row_wise), then generate's warpers (_WARPERS), each
    at most once, in its order, with the default filter value and min_tokens_to_keep 1. Under greedy
    decoding a warper that keeps the most likely token is skipped (it cannot move the argmax). Refuses
    processors that read more than their own rows, and warpers or processors lp would not apply in the
    order given. `shape`: the input_ids' [batch, length]."""
    warped: dict = {"temperature": 1.0} if do_sample else {}
    fields: dict = {"min_new_tokens": 0}
    ignored = cut = warper = None
    last = -1
    applied = None      # the first processor lp applies: a sequence bias must come before any other
    custom: list = []   # the processors lp calls row by row, after those it applies
    for p in processors:
        if isinstance(p, _APPLIED):
            if cut is not None:   # after a cutting warper: its cut would come first (temperature commutes)
                raise ValueError(f"lp.lookahead applies {_named(p)} before the cutting warpers (top-k, top-p, "
                                 f"...), as generate orders its own; it cannot apply it after {_named(cut)}")
            if custom:       # after a prefix_allowed_tokens_fn: commuting with it, or replayed after it
                if not (isinstance(p, _REPLAYED)
                        and all(isinstance(c, (PrefixConstrainedLogitsProcessor, *_REPLAYED)) for c in custom)):
                    raise ValueError(f"lp.lookahead applies {_named(p)} before the processors it calls row by row; "
                                     f"it cannot apply it after {_named(custom[0])}")
                if any(isinstance(c, ForcedEOSTokenLogitsProcessor) for c in (p, *custom)):   # from the forcing on
                    custom.append(p)
            if _biases(p) and applied is not None:
                raise ValueError(f"lp.lookahead adds sequence_bias first, as generate orders its own processors; "
                                 f"it cannot add {_named(p)} after {_named(applied)}")
            applied = applied or p
            key, value = _applied_field(p, shape, eos)
            if key == "min_new_tokens":         # min_length and min_new_tokens: the later end holds
                value = max(value, fields[key])
            elif key in fields:
                raise ValueError(f"lp.lookahead applies one {key}; got two {type(p).__name__}")
            if isinstance(p, RepetitionPenaltyLogitsProcessor):
                ignored = _ignored(p.prompt_ignore_length, shape)
            fields[key] = value
            continue
        kind = next((i for i, cls in enumerate(_WARPERS) if isinstance(p, cls)), None)
        if kind is None:
            if warper is not None:    # it would see the warper's scores, which lp makes after it
                raise ValueError(f"lp.lookahead calls {_named(p)} before the sampling warpers; it cannot call it "
                                 f"after {_named(warper)}")
            custom.append(row_wise(p))
            continue
        warper = p
        cut = p if kind > 0 else cut    # a cut, even one greedy skips: a penalty after it would see its -inf
        if not do_sample:
            if isinstance(p, TypicalLogitsWarper):
                raise ValueError(f"lp.lookahead decodes greedily here, and {_named(p)} can drop the most likely "
                                 f"token, so its argmax is not the model's: lp cannot apply it without sampling")
            continue   # greedy: no other warper moves the argmax
        keep = getattr(p, "min_tokens_to_keep", 1)
        if kind <= last or keep != 1 or getattr(p, "filter_value", -float("inf")) != -float("inf"):
            raise ValueError(f"lp.lookahead samples with each of generate's warpers at most once, in generate's "
                             f"order and settings; it cannot apply {type(p).__name__} here "
                             f"(min_tokens_to_keep={keep}, filter_value={getattr(p, 'filter_value', None)})")
        last = kind
        key, value = list(_WARPERS.values())[kind]
        warped[key] = value(p)
    return {**warped, **fields}, ignored, custom


def stop_test(criteria: Sequence, device: torch.device, rows: int = 1) -> StopTest | None:
    """generate's stopping criteria (other than max_length and EOS) as one StopTest: each called with the
    request's input ids as generate's criteria see them ([1, L] on `device`) and no scores; any True ends
    the request there, as it ends generate's row. Refuses criteria that read the time or the scores, and,
    in a batch of `rows` > 1, one that answers once for the whole batch (a bool, not one per row): generate
    ends every row on it, lp tests each row on its own."""
    for criterion in criteria:
        if type(criterion).__name__ in _NOT_ID_STOPS or not callable(criterion):
            raise ValueError(f"lp cannot apply the stopping criterion {_named(criterion)}: it reads the time or the "
                             f"scores, and lp tests each committed token on its input ids alone")
    if not criteria:
        return None

    def answer(criterion, row: torch.Tensor) -> bool:
        said = torch.as_tensor(criterion(row, None))
        if rows > 1 and said.dim() == 0:
            raise ValueError(f"the stopping criterion {_named(criterion)} answered {said.item()!r} for the whole "
                             f"batch; lp tests each of the batch's {rows} rows on its own, so it needs one answer "
                             f"per row (a bool tensor of shape [batch], as transformers' criteria return)")
        return bool(said.any())

    def stop(key, ids: list[int]) -> bool:
        with as_generate_calls():
            row = torch.tensor([ids], dtype=torch.long, device=device)
            return any(answer(c, row) for c in criteria)
    return stop


def row_wise(p):
    """`p`, a logits processor lp calls row by row (process_by_input), unless it reads more than each row's
    own input ids and scores."""
    if not callable(p):
        raise ValueError(f"a logits processor must be callable as (input_ids, scores); got {short_repr(p, 60)}")
    if type(p).__name__ in _NOT_ROW_WISE or getattr(p, "_num_beams", 1) != 1:
        raise ValueError(f"lp cannot apply the logits processor {_named(p)} exactly: it reads more than "
                         f"each row's own input ids and scores (the batch's other rows or beams, an encoder's "
                         f"input, the model or its own earlier calls), and lp processes its rows one input at a "
                         f"time")
    return p


def row_processor_of(processors: Sequence) -> RowProcessor | None:
    """The processors lp calls row by row, in their order, as one RowProcessor (None: none). A
    prefix_allowed_tokens_fn gets the request's key as its batch id (the prompt's row in the batch, as
    generate numbers it), and its lists come back as kept index tensors (AllowedIds)."""
    if not processors:
        return None
    allowed = {i: AllowedIds(p._prefix_allowed_tokens_fn) for i, p in enumerate(processors)
               if isinstance(p, PrefixConstrainedLogitsProcessor)}

    def process(key, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        with as_generate_calls():
            input_ids, scores = plain(input_ids), plain(scores)
            for i, p in enumerate(processors):
                if i in allowed:      # transformers' own processor; each row of the call is request `key`'s
                    p = PrefixConstrainedLogitsProcessor(lambda _, ids, fn=allowed[i]: fn(key, ids), 1)
                elif isinstance(p, PerRequest):
                    p = p.of(key)
                scores = p(input_ids, scores)
            return scores
    return process


class PerRequest:
    """A processor lp calls row by row whose settings depend on the request (lp.generate's prompts differ
    in length, where generate's batch shares one): `make(key)` -> processor, made once per key."""

    def __init__(self, make):
        self.make, self.made = make, {}

    def of(self, key):
        if key not in self.made:
            self.made[key] = self.make(key)
        return self.made[key]


def replayed_forcing(prompt_length: int, generation, device) -> LogitsProcessorList:
    """generate's processors from the forced EOS on, for a prompt of `prompt_length` tokens: lp replays
    them row by row after a prefix_allowed_tokens_fn, which generate applies before them (_REPLAYED)."""
    out = LogitsProcessorList([ForcedEOSTokenLogitsProcessor(prompt_length + generation.max_new_tokens,
                                                             list(generation.forced_eos_token_id), device)])
    if generation.suppress_tokens:
        out.append(SuppressTokensLogitsProcessor(list(generation.suppress_tokens), device))
    if generation.begin_suppress_tokens:
        out.append(SuppressTokensAtBeginLogitsProcessor(list(generation.begin_suppress_tokens), prompt_length, device))
    return out


class AllowedIds:
    """A prefix_allowed_tokens_fn whose lists come back as index tensors, those of the last few distinct
    lists kept. transformers' processor turns a list of ids into an index at every call (milliseconds for
    most of a vocabulary), and lookahead calls it on every verified row, where many rows allow the same
    ids (a fixed set, a grammar state many rows reach): those cost a list comparison. The index selects
    what the list selects, so the scores are the processor's own; anything but a non-empty list passes
    as it is (an empty one meets transformers' own error)."""

    def __init__(self, fn, keep: int = 8):
        self.fn, self.keep = fn, keep
        self.kept: list[tuple[list, torch.Tensor]] = []      # (a copy of the list, its index), latest first

    def __call__(self, batch_id: int, input_ids: torch.Tensor):
        ids = self.fn(batch_id, input_ids)
        if type(ids) is not list or not ids:
            return ids
        for i, (kept, index) in enumerate(self.kept):
            if kept == ids:
                self.kept.insert(0, self.kept.pop(i))
                return index
        index = torch.tensor(ids, device=input_ids.device)
        self.kept = [(list(ids), index), *self.kept[:self.keep - 1]]
        return index


def _applied_field(p, shape: tuple[int, int], eos: list[int]) -> tuple[str, object]:
    """(the GenerationParams field, its value) of one of generate's processors lp applies (_APPLIED);
    a length processor's EOS ids must be the call's."""
    if isinstance(p, RepetitionPenaltyLogitsProcessor):
        return "repetition_penalty", float(p.penalty)
    if isinstance(p, NoRepeatNGramLogitsProcessor):
        return "no_repeat_ngram_size", int(p.ngram_size)
    if isinstance(p, NoBadWordsLogitsProcessor):        # its words after generate's EOS filter
        return "bad_words_ids", tuple(tuple(int(t) for t in w) for w in p.sequence_bias)
    if _biases(p):
        return "sequence_bias", bias_entries(p.sequence_bias)
    if isinstance(p, SuppressTokensLogitsProcessor):
        return "suppress_tokens", tuple(token_ids(p.suppress_tokens, _named(p)))
    if isinstance(p, ForcedEOSTokenLogitsProcessor):
        return "forced_eos_token_id", (tuple(token_ids(p.eos_token_id, _named(p))), int(p.max_length))
    if isinstance(p, SuppressTokensAtBeginLogitsProcessor):     # (one that begins inside the input: no_op)
        if p.begin_index != shape[1]:
            raise ValueError(f"lp.lookahead suppresses begin_suppress_tokens at the first new token; {_named(p)} "
                             f"begins at input length {p.begin_index}, not {shape[1]}")
        return "begin_suppress_tokens", tuple(token_ids(p.begin_suppress_tokens, _named(p)))
    held = token_ids(p.eos_token_id, _named(p))
    if sorted(held) != sorted(eos):
        raise ValueError(f"lp.lookahead holds back the eos_token_id it stops at ({eos}); {_named(p)} "
                         f"holds back {held}")
    if isinstance(p, MinLengthLogitsProcessor):          # generate counts the padded length
        return "min_new_tokens", max(p.min_length - shape[1], 0)
    return "min_new_tokens", max(p.prompt_length_to_skip + p.min_new_tokens - shape[1], 0)


def _biases(p) -> bool:
    """Whether `p` is a sequence bias (NoBadWordsLogitsProcessor is one too, of -inf: lp bans those)."""
    return isinstance(p, SequenceBiasLogitsProcessor) and not isinstance(p, NoBadWordsLogitsProcessor)


def bias_entries(value) -> tuple[tuple[tuple[int, ...], float], ...]:
    """generate's sequence_bias, a {token ids: bias} mapping or a list of [token ids, bias] pairs, as
    GenerationParams.sequence_bias; a later entry for the same ids replaces an earlier one (generate's
    own conversion)."""
    pairs = value.items() if isinstance(value, Mapping) else value
    try:
        merged = {tuple(int(t) for t in ids): float(bias) for ids, bias in pairs}
    except (TypeError, ValueError):
        raise ValueError(f"sequence_bias {short_repr(value)} must map token id lists to biases") from None
    return tuple(merged.items())


def _ignored(length, shape: tuple[int, int]) -> list[int]:
    """Where each row's repetition penalty starts in its input_ids: transformers' prompt_ignore_length
    (None: nothing ignored; an int for every row; a tensor per row, the left padding generate 5.24 on
    leaves out; 5.17 penalises padding too)."""
    if length is None:
        return [0] * shape[0]
    if isinstance(length, torch.Tensor):
        return [int(x) for x in length.tolist()]
    return [int(length)] * shape[0]



class Ending(NamedTuple):
    """How generate's stopping criteria end the drop-in's rows."""
    new_tokens: int                 # the most new tokens of a row
    eos: list[int]                  # the EOS ids that end a row
    stop_when: StopTest | None      # the caller's other criteria, row by row


def read_criteria(criteria: Sequence, config, processing: dict, shape: tuple[int, int],
                  device: torch.device) -> Ending:
    """The Ending of generate's `criteria` for a [rows, prompt length] batch under generation `config` and
    lp's `processing` knobs (read_processors), or a ValueError where lp would not end rows as generate does.

    generate makes a MaxLengthCriteria and an EosTokenCriteria of its config and lets a caller's own of
    either type (exactly: a subclass is a criterion of its own) take its place, so the criteria it hands on
    are the ones that hold: the shortest max_length (else the config's length), the EOS ids of the
    EosTokenCriteria (else the config's); generate tests its criteria after a first token, so a row gets at
    least one."""
    criteria = list(criteria or [])
    eos = token_ids(config.eos_token_id, "generation_config.eos_token_id")
    lengths = [c.max_length for c in criteria if type(c) is MaxLengthCriteria]
    ends = [token_ids(c.eos_token_id, type(c).__name__) for c in criteria if type(c) is EosTokenCriteria]
    ends = sorted(set().union(*ends)) if ends else eos
    stops = [c for c in criteria if type(c) not in _STOPS]
    if set(ends) != set(eos) and processing.get("min_new_tokens"):
        raise ValueError(f"lp.lookahead ends rows at the EOS ids of the stopping criteria ({ends}); with "
                         f"min_new_tokens it holds back the config's ({eos}), as generate does, only where the two "
                         f"are the same")
    if spared := sorted({w[0] for w in processing.get("bad_words_ids", ()) if len(w) == 1} & set(ends)):
        raise ValueError(f"lp.lookahead cannot ban one-token bad words that are also EOS ids ({spared}): it spares "
                         f"them, as generate spares its config's EOS ids from bad_words_ids")
    if not ends and stops and shape[0] > 1 and not any(hasattr(c, "eos_token_id") for c in stops):
        raise ValueError("lp.lookahead pads a row a stopping criterion ends; generate, with no EOS ids (no "
                         "eos_token_id), goes on decoding it: give an eos_token_id, or one row per call")
    if lengths:
        new = max(1, min(lengths) - shape[1])
    else:
        new = config.max_length - shape[1] if config.max_length is not None else config.max_new_tokens
    if new is None or new < 1:
        raise ValueError(f"lp.lookahead needs at least one new token (max_length {config.max_length}, prompt "
                         f"{shape[1]} tokens)")
    return Ending(new, ends, stop_test(stops, device, shape[0]))


def token_ids(value, name: str) -> list[int]:
    """Token ids as a list, from generate's forms: None (none), an id (a Python, numpy or 0-d tensor
    integer), or a sequence of ids (a list, tuple, range, 1-D array or tensor). Anything else (a string,
    a bool, a float) is refused with a ValueError that names the option `name`."""
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) <= 1:     # a tensor or array: its ints
        value = value.tolist()
    if value is None:
        return []
    ids = [value] if is_token_id(value) else list(value) if isinstance(value, (list, tuple, range)) else None
    if ids is None or not all(is_token_id(t) for t in ids):
        raise ValueError(f"{name} must be a token id or a list of token ids; got {short_repr(value, 60)}")
    return [int(t) for t in ids]


def is_token_id(value) -> bool:
    """An integer that is no bool: a Python or numpy one, or a 0-d integer tensor."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_floating_point() and not value.is_complex() and \
            value.dtype != torch.bool
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# generate's processors a checkpoint's generation_config may set, as GenerationParams names them: numbers
# and lists; its warpers; and what generate applies that a job has no key for
CHECKPOINT_NUMBERS = ("repetition_penalty", "no_repeat_ngram_size", "min_new_tokens")
CHECKPOINT_LISTS = ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_eos_token_id")
CHECKPOINT_WARPERS = ("temperature", "top_h", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
CHECKPOINT_OTHERS = ("min_length", "num_beams", "exponential_decay_length_penalty", "encoder_repetition_penalty")


def unapplied_defaults(config, generation) -> list[str]:
    """What the model's generation_config `config` sets that `model.generate` applies by default and
    `generation` (a job's keys, which are all a job reads besides the EOS ids) does not, as `key=value`:
    its processors set otherwise than off (a list the job sets is its own choice); sampling (do_sample)
    where `generation` is greedy, and its warpers where it samples; and what a job has no key for
    (min_length, beams, ...)."""
    neutral = GenerationConfig()
    sampling = generation.temperature > 0

    def unapplied(key: str, value) -> bool:
        if key in CHECKPOINT_OTHERS:
            return True
        mine = getattr(generation, key, None)
        return not mine if key in CHECKPOINT_LISTS else value != mine

    out = []
    for key in CHECKPOINT_NUMBERS + CHECKPOINT_LISTS + (CHECKPOINT_WARPERS if sampling else ()) + CHECKPOINT_OTHERS:
        value = getattr(config, key, None)
        if value is None or value == getattr(neutral, key, None) or value in ([], {}, ()):
            continue
        if unapplied(key, value):
            out.append(f"{key}={short_repr(value, 40)}")
    if getattr(config, "do_sample", False) and not sampling:
        out.append("do_sample=True")
    return out

"""lp as a library (lp/library.py): `model.generate(..., custom_generate=lp.lookahead)` equals plain
`generate` in float64 (greedy, one prompt and a left-padded batch of several lengths, EOS padding,
return_dict_in_generate), its sampling is distributed as the model's joint (the chi-square harness of
test_sampling), what it cannot do is refused naming the option; `lp.generate` takes text or ids, stop
strings and a streamer that prints the same text as generate's; the README's example runs as written."""
import inspect
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList, TextStreamer
from transformers.generation.stopping_criteria import (ConfidenceCriteria, EosTokenCriteria, MaxLengthCriteria,
                                                      MaxTimeCriteria, StopStringCriteria)
from transformers.generation.logits_process import (
    EncoderNoRepeatNGramLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    EtaLogitsWarper,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

import lp
import lp.library
from lp.baseline import autoregressive_generate
from lp.engine import GenerationParams
from lp.measure.cost_model import row_costs
from lp.models import TinyTokenizer, tiny_random_llama
from lp.tiny import tiny_random
from test_sampling import NEW, PROMPT, chi_square_p, exact_joint

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 9, 12, 5, 9, 30, 41, 5, 9, 12, 7, 7], [33, 8, 33, 8, 14], [20, 21, 22, 20, 21, 22, 20]]
TREE = dict(window=3, ngram=4, guesses=3, lookup_candidates=2, lookup_tokens=6)   # more than the default drafts


@pytest.fixture(scope="module")
def model():
    return tiny_random_llama(vocab=64, seed=0).model.double()


def plain(model, ids, mask=None, **kwargs):
    return model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                          **{"do_sample": False, "pad_token_id": 0, **kwargs})


def left_padded(prompts, pad=0):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("keys", [{}, TREE])
def test_drop_in_greedy_equals_generate(model, keys):
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        got = plain(model, ids, max_new_tokens=30, custom_generate=lp.lookahead, **keys)
        assert torch.equal(got, plain(model, ids, max_new_tokens=30)), prompt


def test_drop_in_batch_of_several_lengths_with_eos_padding(model):
    ids, mask = left_padded(PROMPTS)
    reference = plain(model, ids, mask, max_new_tokens=30)
    eos = int(reference[0, ids.shape[1] + 5])       # the first row ends early; the others pad after it
    reference = plain(model, ids, mask, max_new_tokens=30, eos_token_id=eos)
    got = plain(model, ids, mask, max_new_tokens=30, eos_token_id=eos, custom_generate=lp.lookahead, **TREE)
    assert torch.equal(got, reference)
    assert (got[0, ids.shape[1] + 6:] == 0).all() and got.shape[1] > ids.shape[1] + 6


def test_drop_in_returns_a_dict_and_honours_max_length(model):
    ids = torch.tensor([PROMPTS[0]])
    out = plain(model, ids, max_length=len(PROMPTS[0]) + 9, return_dict_in_generate=True,
                custom_generate=lp.lookahead)
    assert torch.equal(out.sequences, plain(model, ids, max_length=len(PROMPTS[0]) + 9))
    assert out.sequences.shape[1] == len(PROMPTS[0]) + 9


def test_drop_in_sampling_matches_the_models_joint():
    model8 = tiny_random_llama(vocab=8, seed=2).model.double()
    model8.generation_config.eos_token_id = None        # the joint below has no EOS: three tokens every time
    n, temperature, top_p = 2000, 0.8, 0.7
    torch.manual_seed(3)
    ids = torch.tensor([PROMPT] * n)
    out = model8.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature, top_k=0,
                          top_p=top_p, min_p=0.0, max_new_tokens=NEW, pad_token_id=0, custom_generate=lp.lookahead,
                          window=3, ngram=3, guesses=4, suffix_factor=0, job_cache=False)
    counts = Counter(tuple(row) for row in out[:, len(PROMPT):].tolist())
    joint = exact_joint(model8, PROMPT, temperature, 0, top_p)
    cells = sorted(joint)
    assert set(counts) <= set(cells)
    assert chi_square_p([counts[c] for c in cells], [n * joint[c] for c in cells]) > 1e-3
    torch.manual_seed(3)
    again = model8.generate(ids[:50], attention_mask=torch.ones_like(ids[:50]), do_sample=True, temperature=temperature,
                            top_k=0, top_p=top_p, max_new_tokens=NEW, pad_token_id=0, custom_generate=lp.lookahead,
                            window=3, ngram=3, guesses=4, suffix_factor=0, job_cache=False)
    assert torch.equal(again, out[:50])       # torch.manual_seed makes a call reproducible


class Never(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def allowed_after(batch_id, ids):
    """A prefix_allowed_tokens_fn that reads its batch id and the row's last token: one token after a
    multiple of 4, else two thirds of the vocabulary."""
    last = int(ids[-1])
    if last % 4 == 0:
        return [(last + 7 + batch_id) % 64]
    return [t for t in range(64) if (t + last + batch_id) % 3]


def allowed_but_3(batch_id, ids):
    """allowed_after without token 3: generate forces a forced EOS of 3 after the constraint all the same."""
    return [t for t in allowed_after(batch_id, ids) if t != 3] or [5]


def allowed_in_a_buffer():
    """allowed_after, handed back in one list that each call overwrites (the kept indexes must follow it)."""
    buffer = []

    def fn(batch_id, ids):
        buffer[:] = allowed_after(batch_id, ids)
        return buffer
    return fn


class Lift(LogitsProcessor):
    """A user's processor that treats each row on its own: lifts a token named by the row's last one."""

    def __call__(self, input_ids, scores):
        out = scores.clone()
        out[torch.arange(len(input_ids)), (input_ids[:, -1] * 5 + 1) % scores.shape[-1]] += 2.0
        return out


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_beams=2), "beam search"),
    (dict(force_words_ids=[[3, 4]]), r"constrained beam search \(force_words_ids=\[\[3, 4\]\]\)"),
    (dict(dola_layers="low"), r"DoLa decoding \(dola_layers='low'\)"),
    (dict(assistant_early_exit=1), r"early-exit \(assisted\) decoding"),
    (dict(use_mtp=True), r"multi-token prediction \(assisted\) decoding"),
    (dict(encoder_no_repeat_ngram_size=2),
     r"EncoderNoRepeatNGramLogitsProcessor \(encoder_no_repeat_ngram_size\) exactly: it reads more than each row's"),
    (dict(guidance_scale=1.5), r"UnbatchedClassifierFreeGuidanceLogitsProcessor \(guidance_scale\) exactly"),
    (dict(prefix_allowed_tokens_fn=allowed_after,
          logits_processor=LogitsProcessorList([Lift(), RepetitionPenaltyLogitsProcessor(1.2)])),
     r"applies RepetitionPenaltyLogitsProcessor \(repetition_penalty\) before the processors it calls row by row; "
     r"it cannot apply it after PrefixConstrainedLogitsProcessor \(prefix_allowed_tokens_fn\)"),
    (dict(exponential_decay_length_penalty=(5, 1.5), suppress_tokens=[3]),
     r"cannot apply it after ExponentialDecayLengthPenalty \(exponential_decay_length_penalty\)"),
    (dict(logits_processor=LogitsProcessorList([TopKLogitsWarper(5), Lift()])),
     r"calls Lift before the sampling warpers; it cannot call it after TopKLogitsWarper"),
    (dict(logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2),
                                                RepetitionPenaltyLogitsProcessor(1.3)])),
     "applies one repetition_penalty; got two RepetitionPenaltyLogitsProcessor"),
    (dict(repetition_penalty=1.2, logits_processor=LogitsProcessorList([SequenceBiasLogitsProcessor({(3,): 1.0})])),
     r"adds sequence_bias first, as generate orders its own processors; it cannot add SequenceBiasLogitsProcessor"),
    (dict(sequence_bias={(1, 2, 3): 1.0, (2, 3): 2.0}), r"\[1, 2, 3\] and \[2, 3\] can complete on the same token"),
    (dict(logits_processor=LogitsProcessorList([ForcedEOSTokenLogitsProcessor(99, [3])])),
     r"ForcedEOSTokenLogitsProcessor forces it at max_length 99"),
    (dict(logits_processor=LogitsProcessorList([SuppressTokensAtBeginLogitsProcessor([3], 99)])),
     r"begins at input length 99, not 12"),
    (dict(logits_processor=LogitsProcessorList([TypicalLogitsWarper(0.5)])), r"can drop the most likely token"),
    (dict(logits_processor=LogitsProcessorList([EtaLogitsWarper(0.01)]), do_sample=True, top_k=5),
     r"in generate's order and settings; it cannot apply TopKLogitsWarper"),
    (dict(logits_processor=LogitsProcessorList([TopKLogitsWarper(5), RepetitionPenaltyLogitsProcessor(1.2)])),
     r"applies RepetitionPenaltyLogitsProcessor \(repetition_penalty\) before the cutting warpers"),
    (dict(logits_processor=LogitsProcessorList([TopKLogitsWarper(2, filter_value=-1e9),    # greedy skips it, but
                                                RepetitionPenaltyLogitsProcessor(3.0)])),  # its cut still counts
     r"cannot apply it after TopKLogitsWarper"),
    (dict(logits_processor=LogitsProcessorList([MinNewTokensLengthLogitsProcessor(12, 3, [4])]), eos_token_id=5),
     r"holds back \[4\]"),
    (dict(max_time=30.0), r"MaxTimeCriteria \(max_time\)"),
    (dict(output_scores=True, return_dict_in_generate=True), "scores"),
    (dict(stopping_criteria=StoppingCriteriaList([ConfidenceCriteria(0.5)])),
     r"stopping criterion ConfidenceCriteria: it reads the time or the scores"),
    (dict(ngram=2), "lookahead.ngram"),
])
def test_drop_in_refuses_what_it_cannot_do(model, kwargs, match):
    ids = torch.tensor([PROMPTS[0]])
    with pytest.raises(ValueError, match=match):
        plain(model, ids, max_new_tokens=8, custom_generate=lp.lookahead, **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(repetition_penalty=1.4), dict(repetition_penalty=0.7), dict(min_new_tokens=12),
    dict(min_length=24, repetition_penalty=1.2), dict(min_length=16), dict(no_repeat_ngram_size=2),
    dict(no_repeat_ngram_size=3, bad_words_ids=[[14, 14], [50]], repetition_penalty=1.1),
    dict(suppress_tokens=[14, 30, 50], min_new_tokens=2), dict(begin_suppress_tokens=list(range(32))),
    dict(sequence_bias={(14,): -3.0, (43,): 2.5, (14, 43): 4.0, (23, 23, 35): 5.0}, repetition_penalty=1.1),
    dict(forced_eos_token_id=[5, 9], no_repeat_ngram_size=2),
    dict(logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=12)]))])
def test_drop_in_applies_the_repetition_penalty_and_min_lengths(model, kwargs):
    """repetition_penalty, min_new_tokens and min_length (counted from the padded length, as generate
    counts), no_repeat_ngram_size and bad_words_ids (over the padded row, as generate sees it) run as
    generate runs them, on a left-padded batch whose pad id is a token the rows predict
    (transformers 5.17 penalises padding, 5.24 on leaves it out; lp counts what the installed
    version's processor counts) with an EOS: the ids are generate's, and the setting changes them."""
    ids, mask = left_padded(PROMPTS)
    free = plain(model, ids, mask, max_new_tokens=40)[:, ids.shape[1]:]
    eos, pad = int(free[1, 3]), int(free[1, 0])    # an EOS the rows meet early; a pad id a padded row predicts
    ids, mask = left_padded(PROMPTS, pad=pad)
    run = lambda **more: model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40,  # noqa: E731
                                        pad_token_id=pad, eos_token_id=eos, **more)
    want = run(**kwargs)
    assert torch.equal(run(custom_generate=lp.lookahead, **TREE, **kwargs), want)
    assert not torch.equal(want, run())


def test_drop_in_takes_the_later_of_a_min_length_processor_and_min_new_tokens(model):
    """A user's MinLengthLogitsProcessor and min_new_tokens both hold the EOS back: the later end holds,
    whichever comes first in the list."""
    ids = torch.tensor([PROMPTS[0]])
    eos = int(plain(model, ids, max_new_tokens=8)[0, ids.shape[1] + 3])
    kwargs = dict(max_new_tokens=20, eos_token_id=eos, min_new_tokens=2,
                  logits_processor=LogitsProcessorList([MinLengthLogitsProcessor(ids.shape[1] + 10, eos)]))
    want = plain(model, ids, **kwargs)
    assert want.shape[1] > ids.shape[1] + 10
    assert torch.equal(plain(model, ids, custom_generate=lp.lookahead, **TREE, **kwargs), want)


def test_lp_generate_suppresses_at_the_first_new_token_after_a_prefix_fn(model):
    """lp.generate replays generate's processors after a prefix_allowed_tokens_fn (forced EOS, then begin
    suppression): the begin suppression holds at the first new token, not the second, which greedy
    picks here."""
    prompt = PROMPTS[0]
    second = plain(model, torch.tensor([prompt]), max_new_tokens=2)[0, -1].item()
    kwargs = dict(prefix_allowed_tokens_fn=lambda batch_id, ids: list(range(64)), forced_eos_token_id=5,
                  begin_suppress_tokens=[second], max_new_tokens=10)
    want = plain(model, torch.tensor([prompt]), **kwargs)[0, len(prompt):].tolist()
    assert want[1] == second
    assert lp.generate(model, prompt, eos_token_id=None, **kwargs)[0].token_ids == want


def test_a_batch_whose_later_prompt_is_the_longest_sizes_its_cache_for_it(model):
    short, long = [5, 9, 12, 7], (PROMPTS[0] * 25)[:300]
    got = lp.generate(model, [short, long], max_new_tokens=8, eos_token_id=None, batch_size=2)
    assert [r.token_ids for r in got] == [plain(model, torch.tensor([p]), max_new_tokens=8)[0, len(p):].tolist()
                                          for p in (short, long)]


def test_drop_in_samples_with_the_processors_it_is_given(model, monkeypatch):
    """Under sampling the drop-in hands the engine generate's penalty and EOS hold-back with the warpers,
    min_p and a top_p of 0 (generate keeps one token) included (the engine's sampling with them is tested
    against a plain loop: tests/test_processors.py, tests/test_sampling.py)."""
    seen = []
    engine_call = lp.library.lookahead_generate
    monkeypatch.setattr(lp.library, "lookahead_generate",
                        lambda *a, **k: seen.append((a[3], k["seen_prompt"])) or engine_call(*a, **k))
    ids = torch.tensor([PROMPTS[1]])
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.9, top_k=7, top_p=0.0,
                   min_p=0.05, repetition_penalty=1.3, min_new_tokens=4, max_new_tokens=8, pad_token_id=0,
                   eos_token_id=2, custom_generate=lp.lookahead)
    (gen, penalized), = seen
    assert (gen.temperature, gen.top_k, gen.top_p, gen.min_p) == (0.9, 7, 0.0, 0.05)
    assert (gen.repetition_penalty, gen.min_new_tokens) == (1.3, 4)
    assert penalized == (PROMPTS[1], 0)        # the row generate's processors see, all of it penalised
    seen.clear()      # generate's other warpers (each alone tested against generate: tests/test_sampling.py)
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_h=0.9, typical_p=0.8,
                   epsilon_cutoff=0.01, eta_cutoff=0.02, suppress_tokens=[3, 2], max_new_tokens=8, pad_token_id=0,
                   eos_token_id=2, custom_generate=lp.lookahead)
    (gen, _), = seen
    assert (gen.top_h, gen.typical_p, gen.epsilon_cutoff, gen.suppress_tokens) == (0.9, 0.8, 0.01, (3, 2))
    assert gen.eta_cutoff == float(torch.tensor(0.02))      # generate keeps it as a float32 tensor


@pytest.mark.parametrize("kwargs", [
    dict(prefix_allowed_tokens_fn=allowed_after), dict(prefix_allowed_tokens_fn=allowed_in_a_buffer()),
    dict(prefix_allowed_tokens_fn=allowed_after, suppress_tokens=[14, 30], begin_suppress_tokens=[1],
         repetition_penalty=1.2),
    dict(logits_processor=LogitsProcessorList([Lift()]), no_repeat_ngram_size=3),
    dict(exponential_decay_length_penalty=(2, 1.6), eos_token_id=5),
    dict(remove_invalid_values=True, logits_processor=LogitsProcessorList([Lift()]), forced_eos_token_id=[9]),
    # generate forces the EOS after the constraint, then suppresses: lp replays both after it, row by row
    dict(prefix_allowed_tokens_fn=allowed_but_3, forced_eos_token_id=[3, 9], suppress_tokens=[9, 30],
         begin_suppress_tokens=[1])])
def test_drop_in_calls_other_processors_row_by_row(model, kwargs):
    """float64: a processor lp has no device form of (prefix_allowed_tokens_fn with the row's batch id,
    a user's LogitsProcessor, exponential_decay_length_penalty, remove_invalid_values) is called on every
    verified row with that row's own input ids, after lp's own processors: on a left-padded batch, one
    row and three per forward, the ids are generate's, and the setting changes them."""
    ids, mask = left_padded(PROMPTS)
    want = plain(model, ids, mask, max_new_tokens=30, **kwargs)
    assert not torch.equal(want, plain(model, ids, mask, max_new_tokens=30, eos_token_id=kwargs.get("eos_token_id")))
    for batch_size in (1, 3):
        got = plain(model, ids, mask, max_new_tokens=30, custom_generate=lp.lookahead, batch_size=batch_size,
                    row_budget=False, **TREE, **kwargs)
        assert torch.equal(got, want), batch_size


class RepeatAtTwo(StoppingCriteria):
    """A user's criterion on the input ids alone: stop once a row's last token repeats the one two back."""

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == input_ids[:, -3]


def test_drop_in_tests_other_stopping_criteria_after_each_token(model):
    """A stopping criterion on the input ids (a user's; Never, which never stops) is tested after each
    committed token, inside accepted multi-token rounds too: on a left-padded batch, one row and three per
    forward, the ids are generate's, rows ending early padded as generate pads them; the criterion ends
    some rows early."""
    ids, mask = left_padded(PROMPTS)
    criteria = StoppingCriteriaList([Never(), RepeatAtTwo()])
    want = plain(model, ids, mask, max_new_tokens=30, stopping_criteria=criteria)
    assert want.shape[1] < plain(model, ids, mask, max_new_tokens=30).shape[1]
    for batch_size in (1, 3):
        got = plain(model, ids, mask, max_new_tokens=30, stopping_criteria=criteria, custom_generate=lp.lookahead,
                    batch_size=batch_size, row_budget=False, **TREE)
        assert torch.equal(got, want), batch_size


class FirstRowEnds(StoppingCriteria):
    """An old-style criterion: one answer for the whole batch, read from its first row."""

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[0, -1] == input_ids[0, -3]


def test_drop_in_refuses_a_criterion_that_answers_for_the_whole_batch(model):
    """generate ends every row on a criterion's single answer; lp tests each row on its own, so such a
    criterion ended rows that generate goes on decoding (silently other ids). It is refused on a batch; on
    one row it means the same to both."""
    ids, mask = left_padded(PROMPTS)
    criteria = StoppingCriteriaList([FirstRowEnds()])
    with pytest.raises(ValueError, match=r"FirstRowEnds answered .* for the whole batch; .* needs one answer per row"):
        plain(model, ids, mask, max_new_tokens=30, stopping_criteria=criteria, custom_generate=lp.lookahead, **TREE)
    one = torch.tensor([PROMPTS[0]])
    want = plain(model, one, max_new_tokens=30, stopping_criteria=criteria)
    assert want.shape[1] < plain(model, one, max_new_tokens=30).shape[1]     # it ends that row early
    got = plain(model, one, max_new_tokens=30, stopping_criteria=criteria, custom_generate=lp.lookahead, **TREE)
    assert torch.equal(got, want)


def test_drop_in_takes_a_callers_max_length_and_eos_criteria_as_generate_does(model):
    """generate lets a caller's MaxLengthCriteria or EosTokenCriteria take the place of its own: the rows
    end at that length (shorter or longer than max_new_tokens says) or at those EOS ids (and no longer at
    the config's). Before, the drop-in dropped them as generate's own. On a left-padded batch, one row
    and three per forward, the ids are generate's, and each criterion changes them."""
    ids, mask = left_padded(PROMPTS)
    free = plain(model, ids, mask, max_new_tokens=30)
    width = ids.shape[1]
    token = int(free[0, width + 4])
    for criterion in (MaxLengthCriteria(max_length=width + 12), MaxLengthCriteria(max_length=width + 40),
                      EosTokenCriteria(eos_token_id=token), EosTokenCriteria(eos_token_id=[token, 5])):
        criteria = StoppingCriteriaList([criterion])
        want = plain(model, ids, mask, max_new_tokens=30, stopping_criteria=criteria)
        assert not torch.equal(want, free), criterion
        for batch_size in (1, 3):
            got = plain(model, ids, mask, max_new_tokens=30, stopping_criteria=criteria, custom_generate=lp.lookahead,
                        batch_size=batch_size, row_budget=False, **TREE)
            assert torch.equal(got, want), (criterion, batch_size)
    with pytest.raises(ValueError, match=r"EOS ids of the stopping criteria \(\[%d\]\)" % token):
        plain(model, ids, mask, max_new_tokens=30, min_new_tokens=4, custom_generate=lp.lookahead, eos_token_id=7,
              stopping_criteria=StoppingCriteriaList([EosTokenCriteria(eos_token_id=token)]))

    class LateEos(EosTokenCriteria):        # a subclass is a criterion of its own to generate: it stays, and
        def __call__(self, input_ids, scores, **kwargs):        # its own test is the one that holds
            return super().__call__(input_ids, scores, **kwargs) & (input_ids.shape[1] > width + 8)
    extra = [StoppingCriteriaList([LateEos(eos_token_id=token)]),
             StoppingCriteriaList([MaxLengthCriteria(max_length=width - 3)]),      # at most the prompt: one token
             dict(bad_words_ids=[[50, 46]], stopping_criteria=StoppingCriteriaList([EosTokenCriteria(token)]))]
    for more in extra:
        more = more if isinstance(more, dict) else dict(stopping_criteria=more)
        want = plain(model, ids, mask, max_new_tokens=30, **more)
        got = plain(model, ids, mask, max_new_tokens=30, custom_generate=lp.lookahead, row_budget=False, **TREE,
                    **more)
        assert torch.equal(got, want), more
    with pytest.raises(ValueError, match=r"cannot ban one-token bad words that are also EOS ids \(\[%d\]\)" % token):
        plain(model, ids, mask, max_new_tokens=30, custom_generate=lp.lookahead, eos_token_id=token,     # a caller's
              logits_processor=LogitsProcessorList([NoBadWordsLogitsProcessor([[token]], eos_token_id=None)]))  # ban
    eos_less = [EosTokenCriteria.__new__(type("Ids", (EosTokenCriteria,), {}))]      # has eos_token_id: generate pads
    eos_less[0].eos_token_id = torch.tensor([token])
    want = plain(model, ids, mask, max_new_tokens=30, eos_token_id=None, stopping_criteria=StoppingCriteriaList(
        eos_less + [RepeatAtTwo()]))
    got = plain(model, ids, mask, max_new_tokens=30, eos_token_id=None, custom_generate=lp.lookahead,
                stopping_criteria=StoppingCriteriaList(eos_less + [RepeatAtTwo()]))
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="with no EOS ids"):    # generate would go on decoding an ended row
        plain(model, ids, mask, max_new_tokens=30, custom_generate=lp.lookahead, eos_token_id=None,
              stopping_criteria=StoppingCriteriaList([RepeatAtTwo()]))


def test_generate_tests_stopping_criteria_after_each_token(model):
    """lp.generate's stopping_criteria end each prompt where generate's end it (one prompt per call there),
    one prompt and three per forward; a time criterion is refused."""
    want = [upto_eos(model, plain(model, torch.tensor([p]), max_new_tokens=30,
                                  stopping_criteria=StoppingCriteriaList([RepeatAtTwo()]))[0, len(p):].tolist())
            for p in PROMPTS]
    assert sum(map(len, want)) < sum(len(upto_eos(model, plain(model, torch.tensor([p]), max_new_tokens=30)[0, len(p):]
                                                  .tolist())) for p in PROMPTS)
    for batch_size in (1, 3):
        got = lp.generate(model, PROMPTS, max_new_tokens=30, stopping_criteria=[RepeatAtTwo()], batch_size=batch_size,
                          row_budget=False, **TREE)
        assert [r.token_ids for r in got] == want, batch_size
        assert {r.finish_reason for r in got} >= {"stop"}
    with pytest.raises(ValueError, match=r"cannot apply the stopping criterion MaxTimeCriteria"):
        lp.generate(model, PROMPTS[0], stopping_criteria=[MaxTimeCriteria(5.0)])


def test_drop_in_forces_a_bos_after_a_one_token_prompt(model):
    """forced_bos_token_id acts on a one-token input only (generate's cur_len == 1): called row by row, it
    forces z*'s row of the first round and leaves deeper rows alone; the ids are generate's."""
    ids = torch.tensor([[5]])
    want = plain(model, ids, max_new_tokens=20, forced_bos_token_id=9)
    assert int(want[0, 1]) == 9 and not torch.equal(want, plain(model, ids, max_new_tokens=20))
    assert torch.equal(plain(model, ids, max_new_tokens=20, forced_bos_token_id=9, custom_generate=lp.lookahead,
                             **TREE), want)


def test_allowed_ids_are_kept_indexes_of_the_same_ids():
    """AllowedIds hands a list back as an index tensor selecting the same ids, the same tensor for an equal
    list (no new index), a new one when a reused list changed; anything but a non-empty list as it is;
    transformers' processor gives the same scores with it."""
    buffer, calls = [], []

    def fn(batch_id, ids):
        calls.append(batch_id)
        buffer[:] = [int(ids[-1]) % 5, 7] if int(ids[-1]) < 30 else list(range(40))
        return buffer
    allowed, ids = lp.hf_processing.AllowedIds(fn, keep=2), torch.tensor([3, 4])
    first = allowed(0, ids)
    assert first.tolist() == [4, 7] and allowed(1, torch.tensor([9, 4])) is first        # equal list: kept
    assert allowed(0, torch.tensor([31])).tolist() == list(range(40))                    # the buffer changed
    assert allowed(0, torch.tensor([2])).tolist() == [2, 7] and len(allowed.kept) == 2    # only the last two
    assert allowed(0, torch.tensor([4])) is not first and calls == [0, 1, 0, 0, 0]
    for other in ([], (1, 2), torch.tensor([1])):
        assert lp.hf_processing.AllowedIds(lambda b, i, o=other: o)(0, ids) is other
    scores, rows = torch.randn(3, 64), torch.tensor([[1, 4], [2, 33], [5, 9]])
    want = PrefixConstrainedLogitsProcessor(fn, 1)(rows, scores)
    assert torch.equal(PrefixConstrainedLogitsProcessor(lp.hf_processing.AllowedIds(fn), 1)(rows, scores), want)


@pytest.mark.parametrize("kwargs", [dict(min_new_tokens=0), dict(suppress_tokens=[]),
                                    dict(min_length=len(PROMPTS[0])), dict(min_new_tokens=2, eos_token_id=[])])
def test_drop_in_takes_processors_that_change_nothing(model, kwargs):
    """A processor generate builds from a setting that cannot change a score (min_new_tokens=0, an empty
    suppress_tokens, a min_length the prompt has, no eos to hold back) is dropped, not refused: the ids
    are generate's with the same setting (min_p=0 under sampling: test_drop_in_sampling_matches_the_models_joint)."""
    ids = torch.tensor([PROMPTS[0]])
    got = plain(model, ids, max_new_tokens=12, custom_generate=lp.lookahead, **TREE, **kwargs)
    assert torch.equal(got, plain(model, ids, max_new_tokens=12, **kwargs))


@pytest.mark.parametrize("kwargs", [dict(output_scores=True), dict(output_hidden_states=True),
                                    dict(renormalize_logits=True), dict(forced_bos_token_id=1),
                                    dict(penalty_alpha=0.0)])
def test_drop_in_takes_settings_generate_ignores_here(model, kwargs):
    """Settings that cannot change generate's ids in this call run as generate runs them: an output flag
    without return_dict_in_generate (generate drops it), renormalize_logits (a log-softmax), a forced BOS
    after the first token, penalty_alpha 0; and position_ids equal to generate's own."""
    ids, mask = left_padded(PROMPTS)
    default = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    got = plain(model, ids, mask, max_new_tokens=10, custom_generate=lp.lookahead, position_ids=default, **kwargs)
    assert torch.equal(got, plain(model, ids, mask, max_new_tokens=10, **kwargs))


def test_generate_takes_the_usual_shapes_of_prompts(model):
    """lp.generate's prompts: ids as a list, numpy array or ints, 0-d tensors, a [1, n] tensor in a list,
    a 2-D tensor, a tokenizer's output (input_ids and a left-padding attention_mask); and a clear error
    for what is none of these."""
    import numpy as np

    p = PROMPTS[0]
    want = lp.generate(model, p, max_new_tokens=6)[0].token_ids
    for prompts in (np.array(p), [np.int64(t) for t in p], list(torch.tensor(p)), [torch.tensor([p])],
                    {"input_ids": [p]}, {"input_ids": torch.tensor([[0, 0] + p]),
                                         "attention_mask": torch.tensor([[0, 0] + [1] * len(p)])}):
        assert [r.token_ids for r in lp.generate(model, prompts, max_new_tokens=6)] == [want], type(prompts)
    assert [r.token_ids for r in lp.generate(model, torch.tensor([p, p]), max_new_tokens=6)] == [want, want]
    for bad, match in ((5, "got int"), ([1.5, 2.0], "flat sequence of token ids"), ({"ids": [p]}, "need input_ids"),
                       ({"input_ids": [p], "attention_mask": [[1] * (len(p) - 1) + [0]]}, "after a kept token"),
                       ({"input_ids": [p, p], "attention_mask": [[1] * len(p)]}, "one mask value per token"),
                       ({"input_ids": [p], "attention_mask": [[1, 1]]}, "one mask value per token")):
        with pytest.raises(ValueError, match=match):      # a mask of another shape dropped or cut prompts
            lp.generate(model, bad, max_new_tokens=6)
    with pytest.raises(ValueError, match="max_new_tokens: None"):
        lp.generate(model, p, max_new_tokens=None)         # was 256 silently; generate's None means max_length
    for key in ("stopping_criteria", "logits_processor"):  # one object, not a list: named, not "not iterable"
        with pytest.raises(TypeError, match=rf"generate.{key} must be a list; .*pass \[it\]"):
            lp.generate(model, p, max_new_tokens=6, **{key: RepeatAtTwo()})
    for key, value in (("ngram", "4"), ("window", True), ("job_cache", 1)):
        with pytest.raises(ValueError, match=f"lookahead.{key}: {value!r} must be"):
            lp.generate(model, p, max_new_tokens=6, **{key: value})
    assert lp.generate(model, p, max_new_tokens=6, stop_strings=None)[0].token_ids == want


def test_drop_in_refuses_inputs_it_would_otherwise_ignore(model):
    """Arguments lp cannot honour exactly raise, naming them, instead of decoding something else."""
    from transformers import DynamicCache
    from transformers.generation.streamers import BaseStreamer

    ids, mask = left_padded(PROMPTS[:2])
    run = lambda **kw: plain(model, ids, mask=mask, max_new_tokens=6, custom_generate=lp.lookahead, **kw)  # noqa: E731
    with pytest.raises(ValueError, match="integer token ids; got torch.float32"):
        plain(model, ids.float(), mask=mask, max_new_tokens=6, custom_generate=lp.lookahead)
    with pytest.raises(ValueError, match="inputs_embeds"):
        run(inputs_embeds=model.get_input_embeddings()(ids) * 0.5)
    cache = DynamicCache(config=model.config)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.25 / 5.17
    model(ids[:1, :3], **{name: cache})            # a cache holding tokens lp would not read
    with pytest.raises(ValueError, match="past_key_values"):
        plain(model, ids[:1], max_new_tokens=6, custom_generate=lp.lookahead, **{name: cache})
    right = torch.ones_like(mask)
    right[0, 5:] = 0                               # row 0 padded on the right
    with pytest.raises(ValueError, match="row 0 masks position 5, after a kept token"):
        plain(model, ids, mask=right, max_new_tokens=6, custom_generate=lp.lookahead)
    inner = torch.tensor([[5, 0, 12, 5, 9, 30]])     # no mask: generate masks the pad id inside the prompt
    with pytest.raises(ValueError, match=r"masks position 1, .*generate masks every pad_token_id \(0\)"):
        model.generate(inner, do_sample=False, max_new_tokens=6, custom_generate=lp.lookahead)
    gpt2 = tiny_random("gpt2", dtype=torch.float64)      # takes token_type_ids (Llama refuses them itself)
    with pytest.raises(ValueError, match="cannot pass token_type_ids to the model"):
        plain(gpt2, ids, mask=mask, max_new_tokens=6, custom_generate=lp.lookahead,
              token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="position_ids"):
        run(position_ids=(mask.cumsum(-1) + 7).masked_fill(mask == 0, 0))
    for width in (ids.shape[1] - 1, ids.shape[1] + 1):   # a mask of another width (generate numbers the positions
        narrow = torch.ones(2, width, dtype=torch.long)  # from it, and drops an all-ones one) was blamed on
        narrow[0, 0] = 0                                  # position_ids, which the caller never gave
        for given in (narrow, torch.ones(2, width, dtype=torch.long)):
            with pytest.raises(ValueError, match=r"attention_mask|check its shape"):
                plain(model, ids, mask=given, max_new_tokens=6, custom_generate=lp.lookahead)

    class Spy(BaseStreamer):
        def put(self, value):
            pass

        def end(self):
            pass
    with pytest.raises(ValueError, match="batch of 2 rows"):
        run(streamer=Spy())
    for warpers, what in (([TopKLogitsWarper(2), TopKLogitsWarper(20)], "TopKLogitsWarper"),
                          ([TopPLogitsWarper(0.01, min_tokens_to_keep=5)], "min_tokens_to_keep=5")):
        with pytest.raises(ValueError, match=what):
            model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=6, pad_token_id=0, top_k=0,
                           logits_processor=LogitsProcessorList(warpers), custom_generate=lp.lookahead)


def test_drop_in_returns_int64_ids_as_generate_does(model):
    ids = torch.tensor([PROMPTS[0]], dtype=torch.int32)
    out = plain(model, ids, max_new_tokens=6, custom_generate=lp.lookahead)
    assert out.dtype == torch.long and out.tolist() == plain(model, ids.long(), max_new_tokens=6).tolist()


def test_generate_takes_one_stop_string_and_refuses_bad_numbers(model):
    tokenizer = TinyTokenizer(98)
    model98 = tiny_random_llama(vocab=98, seed=4).model.double()
    full = lp.generate(model98, "hello world, hello", tokenizer=tokenizer, max_new_tokens=24)[0].text
    stop = full[7:9]
    one = lp.generate(model98, "hello world, hello", tokenizer=tokenizer, max_new_tokens=24, stop_strings=stop)[0]
    listed = lp.generate(model98, "hello world, hello", tokenizer=tokenizer, max_new_tokens=24, stop_strings=[stop])[0]
    assert one.token_ids == listed.token_ids and one.finish_reason == "stop"
    with pytest.raises(ValueError, match="temperature > 0"):
        lp.generate(model, PROMPTS[0], do_sample=True, temperature=0.0)
    with pytest.warns(UserWarning, match=r"decodes greedily \(do_sample=False\): temperature=0\.5, top_k=3 only"):
        warned = lp.generate(model, PROMPTS[0], max_new_tokens=8, temperature=0.5, top_k=3)[0]   # as generate warns
    assert warned.token_ids == lp.generate(model, PROMPTS[0], max_new_tokens=8)[0].token_ids   # and decodes greedily
    none = dict(temperature=None, top_h=None, top_k=None, top_p=None, min_p=None, typical_p=None, epsilon_cutoff=None,
                eta_cutoff=None, repetition_penalty=None, min_new_tokens=None, suppress_tokens=None)
    assert lp.generate(model, PROMPTS[0], max_new_tokens=8, **none)[0].token_ids == \
        lp.generate(model, PROMPTS[0], max_new_tokens=8)[0].token_ids           # None is off, as for generate
    with pytest.raises(ValueError, match=r"generate.max_new_tokens: 1.5 must be an integer"):
        lp.generate(model, PROMPTS[0], max_new_tokens=1.5)
    with pytest.raises(ValueError, match=r"generate.repetition_penalty: 'x' must be a number"):
        lp.generate(model, PROMPTS[0], repetition_penalty="x")
    with pytest.raises(ValueError, match=r"generation.repetition_penalty: 0.0 must be a finite number > 0"):
        lp.generate(model, PROMPTS[0], repetition_penalty=0.0)
    with pytest.raises(ValueError, match=r"generation.min_new_tokens: -1 must be >= 0"):
        lp.generate(model, PROMPTS[0], min_new_tokens=-1)
    vocab = model.get_output_embeddings().weight.shape[0]        # generate refuses these ids (or fails on them)
    for key, value in (("bad_words_ids", [[vocab]]), ("forced_eos_token_id", [vocab]),
                       ("sequence_bias", {(1, vocab): 1.0})):
        with pytest.raises(ValueError, match=rf"generation.{key}: token ids \[{vocab}.*\] are past the model's"):
            lp.generate(model, PROMPTS[0], max_new_tokens=4, **{key: value})


@pytest.mark.parametrize("key,value", [("eos_token_id", "12"), ("eos_token_id", True), ("eos_token_id", [2.9]),
                                       ("eos_token_id", 2.0), ("forced_eos_token_id", 2.0),
                                       ("forced_eos_token_id", "3"), ("stop_strings", 5), ("stop_strings", ["a", 1]),
                                       ("stop_strings", ""), ("stop_strings", ["a", ""])])
def test_generate_refuses_ids_and_stop_strings_of_another_kind(model, key, value):
    """A string of digits was read as its characters' ids (eos_token_id="12": EOS ids 1 and 2), a bool or a
    float as an int, and a float or an int stop string failed in Python's iteration, naming nothing; an
    empty stop string was refused under the job config's name (generation.stop)."""
    with pytest.raises(ValueError, match=rf"generate.{key} must be "):
        lp.generate(model, PROMPTS[0], tokenizer=TinyTokenizer(98), max_new_tokens=4, **{key: value})


def test_generate_takes_generates_forms_of_token_ids(model):
    """An id, a list, a tuple or a 1-D tensor of ids, numpy's too: the same EOS ids, and the same suppressed
    tokens; stop strings in a set."""
    import numpy as np

    out = [lp.generate(model, PROMPTS[0], max_new_tokens=12, eos_token_id=e)[0].token_ids
           for e in (7, [7], (7,), torch.tensor([7]), torch.tensor(7), np.int64(7), np.array([7]), [np.int64(7)],
                     [torch.tensor(7)], range(7, 8))]
    assert all(o == out[0] for o in out)
    forms = ([14, 30], (14, 30), torch.tensor([14, 30]), np.array([14, 30]), range(14, 31, 16))
    suppressed = [lp.generate(model, PROMPTS[0], max_new_tokens=12, suppress_tokens=s,
                              begin_suppress_tokens=s)[0].token_ids for s in forms]
    assert all(o == suppressed[0] for o in suppressed) and suppressed[0] != out[0]
    tokenizer = TinyTokenizer(98)
    text = lp.generate(model, PROMPTS[0], tokenizer=tokenizer, max_new_tokens=12)[0].text
    stops = [lp.generate(model, PROMPTS[0], tokenizer=tokenizer, max_new_tokens=12, stop_strings=s)[0].text
             for s in ([text[3:5]], (text[3:5],), {text[3:5]})]
    assert stops == [text[:text.index(text[3:5])]] * 3


def test_generate_applies_generates_processors(model):
    """lp.generate's processor knobs are generate's: the same ids in float64, and they change them."""
    knobs = dict(suppress_tokens=[14, 30], no_repeat_ngram_size=2, bad_words_ids=[[9, 12]], repetition_penalty=1.2,
                 begin_suppress_tokens=list(range(32, 64)), sequence_bias=[[[28], -2.0], [[28, 28], 3.0]],
                 forced_eos_token_id=7)
    want = [plain(model, torch.tensor([p]), max_new_tokens=20, **knobs)[0, len(p):].tolist() for p in PROMPTS]
    assert want != [plain(model, torch.tensor([p]), max_new_tokens=20)[0, len(p):].tolist() for p in PROMPTS]
    assert [r.token_ids for r in lp.generate(model, PROMPTS, max_new_tokens=20, **knobs, **TREE)] == want


@pytest.mark.parametrize("bias", [{(28,): 1e39}, {(28,): -1e39, (5, 9): -1e39}])
def test_a_sequence_bias_past_float32s_range_is_generates_infinity(model, bias):
    """generate's float32 bias table rounds a bias past float32's range to infinity and decodes; lp's
    fill of its table raised 'value cannot be converted to type float without overflow' (a job: a
    traceback ending the run)."""
    want = [plain(model, torch.tensor([p]), max_new_tokens=12, sequence_bias=bias)[0, len(p):].tolist()
            for p in PROMPTS]
    for batch_size in (1, 3):
        got = lp.generate(model, PROMPTS, max_new_tokens=12, sequence_bias=bias, batch_size=batch_size,
                          row_budget=False, **TREE)
        assert [upto_eos(model, r.token_ids) for r in got] == [upto_eos(model, w) for w in want]


def upto_eos(model, ids):
    """A generated row up to its first EOS (generate pads the rest)."""
    eos = model.generation_config.eos_token_id
    return next((ids[:i + 1] for i, t in enumerate(ids) if t == eos), ids)


def test_generate_calls_processors_row_by_row(model):
    """lp.generate's prefix_allowed_tokens_fn (the prompt's index as its batch id) and logits_processor are
    generate's on the same batch (float64), one prompt and three per forward; they change the ids; what it
    cannot call row by row, or in generate's order, it refuses."""
    ids, mask = left_padded(PROMPTS)
    for knobs in (dict(prefix_allowed_tokens_fn=allowed_after, suppress_tokens=[30]),
                  dict(logits_processor=[Lift()], repetition_penalty=1.2, forced_eos_token_id=7),
                  # forced after the constraint (which never allows 3), then suppressed, as generate orders them
                  dict(prefix_allowed_tokens_fn=allowed_but_3, forced_eos_token_id=[3, 9], suppress_tokens=[9],
                       begin_suppress_tokens=[1], logits_processor=[Lift()])):
        run = lambda **more: [upto_eos(model, r) for r in  # noqa: E731
                              plain(model, ids, mask, max_new_tokens=20, **more)[:, ids.shape[1]:].tolist()]
        want = run(**{k: LogitsProcessorList(v) if k == "logits_processor" else v for k, v in knobs.items()})
        assert want != run(**{k: v for k, v in knobs.items()
                              if k not in ("prefix_allowed_tokens_fn", "logits_processor")})
        for batch_size in (1, 3):
            got = lp.generate(model, PROMPTS, max_new_tokens=20, batch_size=batch_size, row_budget=False, **knobs,
                              **TREE)
            assert [r.token_ids for r in got] == want, (knobs, batch_size)
    with pytest.raises(ValueError, match=r"prefix_allowed_tokens_fn must be a function"):
        lp.generate(model, PROMPTS[0], prefix_allowed_tokens_fn=[1, 2])
    encoder = EncoderNoRepeatNGramLogitsProcessor(2, torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"EncoderNoRepeatNGramLogitsProcessor \(encoder_no_repeat_ngram_size\) "
                                         r"exactly: it reads more than"):
        lp.generate(model, PROMPTS[0], logits_processor=[encoder])


def test_generate_drafts_from_earlier_completions_and_batches(model, monkeypatch):
    """lp.generate over several prompts: each drafts from the call's earlier completions (a repeated
    prompt takes a few forwards, and as many as the first without job_cache), and batch_size decodes
    several per forward with the row budget, its costs measured at the first batched call on a model
    only; the ids are generate's (float64) at every batch size, and sampled ids the same too."""
    prompts = [*PROMPTS, PROMPTS[0]]
    want = [plain(model, torch.tensor([p]), max_new_tokens=30)[0, len(p):].tolist() for p in prompts]
    one = lp.generate(model, prompts, max_new_tokens=30)
    assert [r.token_ids for r in one] == want
    assert 3 * one[-1].forwards < one[0].forwards       # the repeat follows the first one's completion
    alone = lp.generate(model, prompts, max_new_tokens=30, job_cache=False)
    assert [r.token_ids for r in alone] == want and alone[-1].forwards == alone[0].forwards
    measured = []
    monkeypatch.setattr(lp.library, "row_costs", lambda *a: measured.append(a[2]) or row_costs(*a))
    fresh = tiny_random_llama(vocab=64, seed=0).model.double()      # no costs kept for it yet
    for _ in range(2):
        batched = lp.generate(fresh, prompts, max_new_tokens=30, batch_size=3)
        assert [r.token_ids for r in batched] == want
        assert max(r.batch_per_round and max(r.batch_per_round) for r in batched) > 1     # shared forwards
    assert measured == [3]
    sampled = dict(max_new_tokens=16, do_sample=True, temperature=0.8, seed=5)
    assert [r.token_ids for r in lp.generate(model, prompts, **sampled)] == \
        [r.token_ids for r in lp.generate(model, prompts, batch_size=4, row_budget=False, **sampled)]
    with pytest.raises(ValueError, match=r"generation.batch_size: 0 must be >= 1"):
        lp.generate(model, prompts, batch_size=0)


def test_drop_in_rows_draft_from_the_rows_before_and_batch(model, monkeypatch):
    """A left-padded batch in the drop-in: each row drafts from the rows decoded before it, so a
    repeated row takes a few forwards; with batch_size the rows share forwards (decode_batch, each with
    the row generate's processors see); the ids stay generate's."""
    forwards, batched = [], []
    engine_call, batch_call = lp.library.lookahead_generate, lp.library.decode_batch
    monkeypatch.setattr(lp.library, "lookahead_generate",
                        lambda *a, **k: (lambda r: forwards.append(r.forwards) or r)(engine_call(*a, **k)))
    monkeypatch.setattr(lp.library, "decode_batch",
                        lambda *a, **k: batched.append(k["batch_size"]) or batch_call(*a, **k))
    ids, mask = left_padded([PROMPTS[0], PROMPTS[1], PROMPTS[0]])
    want = plain(model, ids, mask, max_new_tokens=30)
    assert torch.equal(plain(model, ids, mask, max_new_tokens=30, custom_generate=lp.lookahead), want)
    assert 3 * forwards[2] < forwards[0] and not batched
    got = plain(model, ids, mask, max_new_tokens=30, custom_generate=lp.lookahead, batch_size=4, row_budget=False)
    assert torch.equal(got, want) and batched == [3]
    penalised = dict(max_new_tokens=30, repetition_penalty=1.3, no_repeat_ngram_size=2)
    assert torch.equal(plain(model, ids, mask, custom_generate=lp.lookahead, batch_size=2, row_budget=False,
                             **penalised), plain(model, ids, mask, **penalised))
    with pytest.raises(ValueError, match=r"generation.batch_size: 0 must be >= 1"):
        plain(model, ids, mask, max_new_tokens=4, custom_generate=lp.lookahead, batch_size=0)
    with pytest.raises(ValueError, match=r"lookahead.batch_size: '2' must be an integer"):
        plain(model, ids, mask, max_new_tokens=4, custom_generate=lp.lookahead, batch_size="2")


def test_generate_text_ids_and_stop_strings(model):
    tokenizer = TinyTokenizer(98)
    model98 = tiny_random_llama(vocab=98, seed=4).model.double()
    texts = ["abcabcab", "hello world, hello"]
    results = lp.generate(model98, texts, tokenizer=tokenizer, max_new_tokens=24, **TREE)
    assert [r.token_ids for r in results] == [
        plain(model98, torch.tensor([tokenizer.encode(t)]), max_new_tokens=24)[0, len(t):].tolist() for t in texts]
    assert results[0].text == tokenizer.decode(results[0].token_ids)
    ids_results = lp.generate(model, PROMPTS[1], max_new_tokens=20)
    assert len(ids_results) == 1
    assert ids_results[0].token_ids == plain(model, torch.tensor([PROMPTS[1]]), max_new_tokens=20)[0, 5:].tolist()
    full = results[1].text
    stop = full[7:9]                                   # a string the uncut output completes mid-way
    cut = lp.generate(model98, texts[1], tokenizer=tokenizer, max_new_tokens=24, stop_strings=[stop], **TREE)[0]
    reference = autoregressive_generate(model98, tokenizer.encode(texts[1]), GenerationParams(24, stop=(stop,)),
                                        tokenizer=tokenizer)
    assert cut.token_ids == reference.token_ids and cut.finish_reason == "stop" and stop not in cut.text
    with pytest.raises(TypeError, match=r"unknown lookahead option\(s\) windows \(did you mean window\?\)"):
        lp.generate(model, PROMPTS[0], windows=3)
    with pytest.raises(TypeError, match=r"max_new_token \(did you mean max_new_tokens\?\)"):   # a knob misspelt
        lp.generate(model, PROMPTS[0], max_new_token=3)
    with pytest.raises(ValueError, match="tokenizer"):
        lp.generate(model, "abc")


class Captured(TextStreamer):
    def __init__(self, tokenizer, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.pieces = []

    def on_finalized_text(self, text, stream_end=False):
        self.pieces.append(text)


@pytest.mark.parametrize("skip_prompt", [False, True])
def test_a_text_streamer_prints_what_generate_prints(skip_prompt):
    tokenizer = TinyTokenizer(98)
    model98 = tiny_random_llama(vocab=98, seed=4).model.double()
    ids = tokenizer.encode("abc abc ab")
    ours, theirs = Captured(tokenizer, skip_prompt=skip_prompt), Captured(tokenizer, skip_prompt=skip_prompt)
    result = lp.generate(model98, ids, max_new_tokens=30, streamer=ours, **TREE)[0]
    plain(model98, torch.tensor([ids]), max_new_tokens=30, streamer=theirs)
    assert "".join(ours.pieces) == "".join(theirs.pieces) != ""
    assert max(result.emitted_per_round) > 1 and len(ours.pieces) > 1   # rounds of several tokens, streamed
    with pytest.raises(ValueError, match="one prompt"):
        lp.generate(model98, [ids, ids], streamer=ours)
    drop_in = Captured(tokenizer, skip_prompt=skip_prompt)      # the streamer passed to generate itself
    plain(model98, torch.tensor([ids]), max_new_tokens=30, streamer=drop_in, custom_generate=lp.lookahead, **TREE)
    assert "".join(drop_in.pieces) == "".join(theirs.pieces)

    def wrapped(model, input_ids, *args, **kwargs):      # a user's custom_generate that calls lp.lookahead
        return lp.lookahead(model, input_ids, *args, **kwargs, **TREE)
    through = Captured(tokenizer, skip_prompt=skip_prompt)
    plain(model98, torch.tensor([ids]), max_new_tokens=30, streamer=through, custom_generate=wrapped)
    assert "".join(through.pieces) == "".join(theirs.pieces)


def test_drop_in_refuses_an_assistant_model(model):
    with pytest.raises(ValueError, match="assistant_model"):
        plain(model, torch.tensor([PROMPTS[0]]), max_new_tokens=8, custom_generate=lp.lookahead,
              assistant_model=tiny_random_llama(vocab=64, seed=5).model.double())


def test_readme_library_example_runs_as_written(capsys):
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- library example", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    model, tokenizer, ids, out = scope["model"], scope["tokenizer"], scope["ids"], scope["out"]
    greedy = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48)
    assert torch.equal(out, greedy)
    assert len(scope["results"]) == 2 and all(r.new_tokens >= 1 for r in scope["results"])
    printed = capsys.readouterr().out
    assert tokenizer.decode(out[0][ids.shape[1]:]) in printed


def test_drop_in_stops_at_a_stop_string_criterion_as_generate(smollm2_f64):
    """transformers' StopStringCriteria (generate refuses stop_strings for a callable custom_generate, which
    it gives no tokenizer; the criterion itself reaches lp) ends the embedded model's rows where it ends
    generate's, in float64, the stop string inside a multi-token round or not."""
    model, tokenizer = smollm2_f64.model, smollm2_f64.tokenizer
    prompts = [tokenizer.encode("def fibonacci(n):"), tokenizer.encode("class Stack:\n    def push(self, x):")]
    ids, mask = left_padded(prompts, model.generation_config.pad_token_id)
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, ["return", "self."])])
    want = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, stopping_criteria=criteria)
    assert want.shape[1] < ids.shape[1] + 40          # the stop strings end both rows early
    got = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, stopping_criteria=criteria,
                         custom_generate=lp.lookahead, window=4, ngram=4, guesses=4, lookup_candidates=2)
    assert torch.equal(got, want)


def test_drop_in_on_the_embedded_model_in_float64(smollm2_f64):
    """The embedded SmolLM2 in float64: the drop-in (the default job's lookahead keys and a window config)
    equals plain greedy generate on a left-padded batch of two prompts of different lengths."""
    model, tokenizer = smollm2_f64.model, smollm2_f64.tokenizer
    prompts = [tokenizer.encode("def fibonacci(n):"), tokenizer.encode("class Stack:\n    def push(self, x):")]
    pad = model.generation_config.pad_token_id
    ids, mask = left_padded(prompts, pad)
    reference = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    for keys in ({}, dict(window=4, ngram=4, guesses=4, lookup_candidates=2)):
        got = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40,
                             custom_generate=lp.lookahead, **keys)
        assert torch.equal(got, reference), keys


def test_generate_samples_with_generates_default_top_k():
    """lp.generate(do_sample=True) samples what generate(do_sample=True) samples: generate keeps its
    top-50 by default (its first scores leave 14 of 64 tokens out), and so does lp.generate's default,
    while top_k=None turns it off in both."""
    model64 = tiny_random_llama(vocab=64, seed=5).model.double()
    ids = torch.tensor([PROMPTS[1]])
    scores = model64.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=3.0,
                              max_new_tokens=1, pad_token_id=0, output_scores=True,
                              return_dict_in_generate=True).scores[0][0]
    kept = set(torch.isfinite(scores).nonzero().flatten().tolist())
    assert len(kept) == 50
    firsts = {name: {r.token_ids[0] for r in lp.generate(model64, [PROMPTS[1]] * 400, max_new_tokens=1,
                                                           do_sample=True, temperature=3.0, **knobs)}
              for name, knobs in (("default", {}), ("off", dict(top_k=None)))}
    assert firsts["default"] <= kept and len(firsts["default"]) > 30
    assert firsts["off"] - kept            # the control: without top-50, the 14 others are drawn too


def test_generate_seed_none_draws_from_torchs_generator(model):
    """seed=None was seed 0 (the same draws every call); it now draws a seed from torch's global generator,
    as the drop-in does: calls differ, and torch.manual_seed makes one reproducible."""
    def draw():
        return [r.token_ids for r in lp.generate(model, PROMPTS, max_new_tokens=12, do_sample=True, seed=None)]
    torch.manual_seed(3)
    first, second = draw(), draw()
    torch.manual_seed(3)
    assert draw() == first and second != first
    assert first != [r.token_ids for r in lp.generate(model, PROMPTS, max_new_tokens=12, do_sample=True, seed=0)]
    state = torch.get_rng_state()          # greedy draws nothing, so it leaves torch's generator as it was
    lp.generate(model, PROMPTS[0], max_new_tokens=4, seed=None)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_refused_sampled_call_leaves_torchs_generator_alone(model):
    """An unseeded sampled call drew its seed before its checks, so a refused one (as generate refuses it,
    drawing nothing) still moved torch's global generator and every later seeded draw of the process."""
    refused = [
        lambda: lp.generate(model, PROMPTS, max_new_tokens=4, do_sample=True, seed=None, temperature=0.0),
        lambda: lp.generate(model, PROMPTS, max_new_tokens=4, do_sample=True, seed=None, stop_strings=["x"]),
        lambda: lp.generate(model, [[1, 2, 999]], max_new_tokens=4, do_sample=True, seed=None),    # the decode's
        lambda: model.generate(torch.tensor([[1, 2, 999]]), max_new_tokens=4, do_sample=True,   # own refusals
                               custom_generate=lp.lookahead),
        lambda: model.generate(torch.tensor([[0, 5, 9], [7, 8, 0]]), attention_mask=torch.tensor([[0, 1, 1], [1, 1, 0]]),
                               max_new_tokens=4, do_sample=True, custom_generate=lp.lookahead),
    ]
    for call in refused:
        state = torch.get_rng_state()
        with pytest.raises(ValueError):
            call()
        assert torch.equal(torch.get_rng_state(), state)
    state = torch.get_rng_state()      # the control: a call that decodes draws its seed
    lp.generate(model, PROMPTS[0], max_new_tokens=4, do_sample=True, seed=None)
    assert not torch.equal(torch.get_rng_state(), state)


def test_callbacks_run_under_no_grad_as_generates_do(model):
    """lp decoded under torch.inference_mode: a tensor a user's processor, criterion or streamer kept was an
    inference tensor, and using that object with generate (or autograd) afterwards failed."""
    class Keeps(LogitsProcessor, StoppingCriteria):
        def __init__(self):
            self.modes, self.kept = set(), torch.zeros(1)

        def seen(self, *given):
            self.modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled(),
                            any(t.is_inference() for t in given)))
            self.kept = self.kept + 1          # a tensor made here and kept

        def __call__(self, input_ids, scores):          # as a processor and as a criterion
            self.seen(input_ids, *([] if scores is None else [scores]))
            return scores if scores is not None else torch.zeros(input_ids.shape[0], dtype=torch.bool)

        def put(self, ids):                             # as a streamer
            self.seen(ids)

        def end(self):
            pass

    seen = {}
    ids = torch.tensor([PROMPTS[0]])
    for name, call in (("generate", lambda k: model.generate(ids, max_new_tokens=4, do_sample=False, streamer=k,
                                                             logits_processor=[k], stopping_criteria=[k])),
                       ("drop-in", lambda k: model.generate(ids, max_new_tokens=4, do_sample=False, streamer=k,
                                                            logits_processor=[k], stopping_criteria=[k],
                                                            custom_generate=lp.lookahead)),
                       ("lp.generate", lambda k: lp.generate(model, PROMPTS[0], max_new_tokens=4, streamer=k,
                                                             logits_processor=[k], stopping_criteria=[k]))):
        keeps = Keeps()
        call(keeps)
        seen[name] = (keeps.modes, keeps.kept.is_inference(), float(keeps.kept))
        keeps.kept.add_(1)                     # an inference tensor refuses this outside inference mode
    assert seen["generate"][:2] == ({(False, False, False)}, False) and seen["generate"][2] > 4
    assert seen["drop-in"][:2] == seen["lp.generate"][:2] == seen["generate"][:2]


def test_the_row_budgets_grid_is_measured_again_after_a_dtype_move(monkeypatch):
    """The forward-time grid kept for a model's batched calls was reused after the model moved to another
    dtype (or device), where its forwards cost something else."""
    measured = []
    real = lp.library.row_costs
    monkeypatch.setattr(lp.library, "row_costs", lambda model, *a: measured.append(next(model.parameters()).dtype)
                        or real(model, *a))
    model = tiny_random("llama", dtype=torch.float64)
    for dtype in (torch.float64, torch.float64, torch.float32, torch.float32):
        model.to(dtype)
        lp.generate(model, PROMPTS, max_new_tokens=4, batch_size=2)
    assert measured == [torch.float64, torch.float32]


def test_a_composite_models_batched_call_measures_its_grid():
    """A multimodal checkpoint (Gemma 3's, which AutoModelForCausalLM loads whole) decoded text at batch 1,
    but a batched call (a job's default batch of 5 too) died measuring the row budget's grid: its config has
    no vocab_size of its own (the text config has)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    config = Gemma3Config(text_config=dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16,
                                           initializer_range=0.15, max_position_embeddings=512),
                          vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14),
                          mm_tokens_per_image=4, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).double().eval()
    assert not hasattr(model.config, "vocab_size")
    prompts = [[5, 9, 12, 5, 9, 30, 41], [7, 8, 9, 7, 8]]
    got = [r.token_ids for r in lp.generate(model, prompts, max_new_tokens=24, batch_size=2)]
    want = [plain(model, torch.tensor([p]), max_new_tokens=24)[0, len(p):].tolist() for p in prompts]
    assert got == want
    # the drop-in too: generate hands it an empty mm_encoder_outputs, which it refused as a model input
    assert [plain(model, torch.tensor([p]), max_new_tokens=24, custom_generate=lp.lookahead)[0, len(p):].tolist()
            for p in prompts] == want


def test_calls_on_one_model_from_two_threads_run_one_at_a_time(monkeypatch):
    """A thread's batched call measuring its row-cost grid writes the K/V cache it keeps on the model;
    a call from another thread took that same cache for its decode (it was not busy yet) and decoded
    from what the grid's forwards wrote there. The second call now waits for the first: both equal
    generate. The grid's first forward of two requests waits (at most 2 s) for the other call to be
    mid-decode, which it never is once calls run one at a time."""
    import threading

    import lp.decode.batch

    # 128 positions: the grid is measured over no cached tokens, in a cache of the second call's 256 slots
    model = tiny_random("llama", dtype=torch.float64, max_position_embeddings=128)
    first, second = PROMPTS[:2], [[3, 4, 5, 3, 4, 5, 3], [9, 10, 9, 10]]
    new = 40
    want = [upto_eos(model, plain(model, torch.tensor([p]), max_new_tokens=new)[0, len(p):].tolist())
            for p in first + second]
    probing, decoding, wrote = threading.Event(), threading.Event(), threading.Event()
    real, calls = lp.decode.batch.forward_round, []

    def probe_forward(model, dev, batch, shape, first_row, cache, *args, **kwargs):
        if cache.batch == 2:
            calls.append(1)
            if len(calls) == 1:
                probing.set()
                decoding.wait(2)
            elif len(calls) == 2:
                wrote.set()
        return real(model, dev, batch, shape, first_row, cache, *args, **kwargs)

    class Pause(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            if not decoding.is_set():
                decoding.set()
                wrote.wait(2)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    monkeypatch.setattr(lp.decode.batch, "forward_round", probe_forward)
    got = {}

    def other():
        probing.wait(60)
        got["second"] = lp.generate(model, second, max_new_tokens=new, batch_size=2, row_budget=False,
                                    stopping_criteria=[Pause()])

    thread = threading.Thread(target=other)
    thread.start()
    got["first"] = lp.generate(model, first, max_new_tokens=new, batch_size=2)
    thread.join(120)
    assert len(calls) > 2 and probing.is_set() and not thread.is_alive()
    assert [r.token_ids for r in got["first"] + got["second"]] == want


@pytest.mark.parametrize("how", ["recurrent", "flex_attention"])
def test_a_refused_model_is_refused_before_the_grid_is_measured(how):
    """At batch_size > 1 the row budget's grid ran the model's forwards before the refusal was reached:
    a mamba model ended in an IndexError, a flex-attention llama in torch's InductorError. Every batch size
    now gets the refusal batch 1 gets."""
    model = tiny_random("mamba" if how == "recurrent" else "llama", dtype=torch.float64)
    if how == "flex_attention":
        model.config._attn_implementation = "flex_attention"
    match = "recurrent-state layers" if how == "recurrent" else "attn_implementation 'flex_attention'"
    for batch_size in (1, 3):
        with pytest.raises(ValueError, match=match):
            lp.generate(model, PROMPTS, max_new_tokens=4, batch_size=batch_size)
        with pytest.raises(ValueError, match=match):
            ids, mask = left_padded(PROMPTS)
            model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                           custom_generate=lp.lookahead, batch_size=batch_size)


def test_a_model_in_a_state_lp_cannot_decode_is_refused_in_one_line():
    """Weights offloaded to the meta device (accelerate's cpu_offload, or later layers only) ended inside
    accelerate or torch ('Cannot copy out of meta tensor'); GPT-2 in training mode with gradient
    checkpointing in a size mismatch inside SDPA; a model in training mode with dropout (or Falcon's
    functional dropout, or Mixtral's router jitter) decoded other ids than its eval mode's with no word. A
    module in training mode or a meta tensor is refused in one line now, saying what to do."""
    from accelerate import cpu_offload

    offloaded = cpu_offload(tiny_random("llama", dtype=torch.float64), execution_device=torch.device("cpu"))
    with pytest.raises(ValueError, match="weights on the meta device .*load it onto one device"):
        lp.generate(offloaded, PROMPTS[:1], max_new_tokens=4)
    later = tiny_random("llama", dtype=torch.float64)
    later.model.layers[1].to("meta")
    with pytest.raises(ValueError, match="weights on the meta device"):
        lp.generate(later, PROMPTS[:1], max_new_tokens=4, batch_size=3)
    gpt2 = tiny_random("gpt2", dtype=torch.float64)
    want = [r.token_ids for r in lp.generate(gpt2, PROMPTS, max_new_tokens=8)]
    for train in (lambda m: m.train(), lambda m: m.transformer.h[1].attn.resid_dropout.train(),
                  lambda m: m.gradient_checkpointing_enable() or m.train()):
        train(gpt2)
        for batch_size in (1, 3):
            with pytest.raises(ValueError, match=r"training mode \(model.train\(\), or a module.*model.eval\(\)"):
                lp.generate(gpt2, PROMPTS, max_new_tokens=8, batch_size=batch_size)
        gpt2.eval()
        assert [r.token_ids for r in lp.generate(gpt2, PROMPTS, max_new_tokens=8)] == want
    falcon = tiny_random("falcon", dtype=torch.float64, hidden_dropout=0.5).train()
    with pytest.raises(ValueError, match="training mode"):
        lp.generate(falcon, PROMPTS[:1], max_new_tokens=4)

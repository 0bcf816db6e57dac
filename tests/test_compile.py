"""Compiled rounds (model.compile: default): torch.compile(fullgraph=True, dynamic=False) of the round
forward on rounds padded to fixed sizes gives generate's tokens in float64 (a graph break would raise)."""
import pytest
import torch

from lp.decode.layout import bucket
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.models import tiny_random_llama
from test_exactness import greedy

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


def test_buckets_are_few_and_fit():
    sizes = {bucket(q) for q in range(1, 600)}
    assert sizes == {8, 16, 32, 64, 128, 256, 512, 1024}
    assert all(bucket(q) >= q for q in range(1, 600))


@pytest.mark.slow
def test_compiled_rounds_identical_to_generate():
    torch._dynamo.reset()
    model = tiny_random_llama(vocab=16, seed=1).model.double()
    params = LookaheadParams(3, 4, 3, lookup_candidates=2, lookup_tokens=6, suffix_factor=4, suffix_tokens=8)
    r = lookahead_generate(model, PROMPT, params, GenerationParams(24), compile_mode="default")
    assert r.token_ids == greedy(model, PROMPT, 24)
    assert max(r.emitted_per_round) > 1


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma2", "deepseek-v3"])
def test_compiled_rounds_on_windowed_and_mla_models(family):
    """The compiled path with a mask per layer type (Gemma 2: sliding and full layers, eager, soft-capped)
    and with keys and values of different head sizes (DeepSeek-V3's MLA; dense MLPs: float64 experts run
    transformers' eager loop, whose data-dependent shapes fullgraph cannot trace), in float64."""
    from lp.tiny import tiny_random
    from test_architectures import PROMPTS, generate

    torch._dynamo.reset()
    model = tiny_random(family, dtype=torch.float64, **({"first_k_dense_replace": 2} if family == "deepseek-v3" else {}))
    params = LookaheadParams(3, 4, 3, lookup_candidates=2, lookup_tokens=6, suffix_factor=4, suffix_tokens=20)
    r = lookahead_generate(model, PROMPTS[1], params, GenerationParams(44), compile_mode="default")
    assert r.token_ids == generate(model, PROMPTS[1])
    assert max(r.emitted_per_round) > 1


def test_compiled_rounds_keep_every_rows_logits(monkeypatch):
    """A compiled round's shape is (rows, attended slots) alone: it keeps every fed row's logits, so
    a job compiles a graph per pair and not per size of the logit frame too. Run with the compiled
    rounds' layout and an eager forward (the shapes are the packer's), in float64 against generate."""
    import lp.decode.batch as batch
    import lp.engine as engine

    model = tiny_random_llama(vocab=16, seed=1).model.double()
    monkeypatch.setattr(engine, "compiled_forward", lambda m, mode: None if mode == "off" else m)
    shapes, forward_logits = [], batch.forward_logits

    def recorded(model, input_ids, position_ids, mask, cache, logit_rows, *args, **kwargs):
        shapes.append((input_ids.shape[1], logit_rows))
        return forward_logits(model, input_ids, position_ids, mask, cache, logit_rows, *args, **kwargs)
    monkeypatch.setattr(batch, "forward_logits", recorded)
    params = LookaheadParams(3, 4, 3, lookup_candidates=2, lookup_tokens=6, suffix_factor=4, suffix_tokens=8)
    r = lookahead_generate(model, PROMPT, params, GenerationParams(24), compile_mode="default")
    assert r.token_ids == greedy(model, PROMPT, 24) and max(r.emitted_per_round) > 1
    assert len(shapes) == r.forwards and all(k == q for q, k in shapes), shapes


def test_a_forward_that_does_not_compile_is_one_clear_error(tmp_path):
    """A round forward that torch.compile cannot lower (linears packed for oneDNN) or trace (float64
    experts in transformers' eager loop, whose shapes depend on the routing) fails in one line that says
    so and how to decode instead: a ValueError from the library, a job's `error:` line with exit 1."""
    import json

    import yaml
    from click.testing import CliRunner

    from lp.decode.kv_cache import CompileFailed
    from lp.models import use_onednn_linears
    from lp.run import main

    torch._dynamo.reset()
    model = tiny_random_llama(vocab=16, seed=1).model
    assert use_onednn_linears(model)
    with pytest.raises(CompileFailed, match="could not compile LlamaForCausalLM's round forward .*InductorError.*"
                                            r"decode without compiling \(model.compile: off"):
        lookahead_generate(model, PROMPT, LookaheadParams(), GenerationParams(8), compile_mode="default")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"task_id": "a", "prompt": "abcabc"}) + "\n")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "tiny-random-mixtral?vocab=64&layers=2&seed=0", "dtype": "float64", "compile": "default"},
        "generation": {"max_new_tokens": 8}, "data": {"source": "jsonl", "path": str(prompts)},
        "output": {"dir": str(tmp_path / "out")}}))
    result = CliRunner().invoke(main, ["--config", str(config)])
    assert result.exit_code == 1, result.output
    assert "error: torch.compile could not compile MixtralForCausalLM's round forward (UserError" in result.output
    assert "Traceback" not in result.output

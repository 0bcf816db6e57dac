import os
import shutil
import tempfile

import pytest
import torch

from lp.models import load_model, tiny_random_llama

_cache_dir = None


def pytest_configure(config):
    """Converted models (the embedded GGUF) go to one temporary directory for the whole session,
    never to the user's ~/.cache/lp: lp.models reads LP_CACHE_DIR, and every process a test
    starts inherits it, so the conversion happens once per session."""
    global _cache_dir
    _cache_dir = tempfile.mkdtemp(prefix="lp-test-cache-")
    os.environ["LP_CACHE_DIR"] = _cache_dir


def pytest_unconfigure(config):
    if _cache_dir:
        shutil.rmtree(_cache_dir, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Slow tests run only when a -m expression asks for them (`pytest -m slow`);
    a bare `pytest` deselects them, like CI's `-m "not slow"`."""
    if config.option.markexpr:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def tiny_model64():
    """A seeded random Llama in float64 (exactness tests)."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return tiny_random_llama(vocab=64, seed=0).model.double()


@pytest.fixture(scope="session")
def smollm2_f64():
    """The embedded SmolLM2-135M in float64 (exactness), loaded once for every test that needs it."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return load_model("smollm2-135m", dtype="float64", device="cpu")


@pytest.fixture(scope="session")
def model16():
    """A seeded random Llama of 16 tokens in float64 (round counts: syncs, uploads, ops)."""
    return tiny_random_llama(vocab=16, seed=1).model.double()


def own_completion_corpus(model, prompt, tokens):
    """A job corpus holding `prompt`'s own greedy completion of `tokens` tokens: suffix trees hit deep."""
    from lp.decode.suffix import SuffixIndex
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=tokens,
                         pad_token_id=0)[0, len(prompt):].tolist()
    index = SuffixIndex(8)
    index.add(out)
    return index

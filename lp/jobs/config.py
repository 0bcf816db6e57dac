"""Job configuration: typed sections loaded from YAML, checked before any model work.

A job file has seven sections (every one optional; missing keys take the
defaults below, which are the embedded default job configs/humaneval-smollm2.yaml):

    model:      {name: smollm2-135m, dtype: float32, device: auto, compile: off, cpu_linear: auto,
                 attn_implementation: auto}
    lookahead:  {window: 0, ngram: 4, guesses: 0, lookup_candidates: 0, suffix_factor: 8,
                 suffix_tokens: 32, suffix_min_score: 0.1, job_cache: true, ...}
    generation: {method: lookahead, max_new_tokens: 256, batch_size: <see below>, stop: <see below>}
    data:       {source: humaneval, offset: 0, limit: 20, chat_template: true,
                 instruction: CODE_INSTRUCTION, response_prefix: "```python"}  # or {source: jsonl|classeval, path: FILE}
    output:     {dir: runs/humaneval-smollm2, evaluate: false, evaluate_timeout_s: 10}
    distributed: {backend: auto, timeout_s: 300, lp_size: null}   # used under torchrun
    baseline:   {enabled: false}                   # `baseline: true` is short for {enabled: true}

`data.chat_template` left out means true (the chat code-completion mode,
lp/jobs/code.py) for the code sources humaneval and classeval and false for
jsonl; `generation.stop` left out means CHAT_CODE_STOP (the closing fence) in
the chat mode, else CODE_COMPLETION_STOP for the code sources and no stop
strings for jsonl; `stop: []` always means none. `generation.batch_size` left
out means JOB_BATCH_SIZE requests per forward for a lookahead job without the
in-run baseline, else 1 (autoregressive decoding and the baseline take one
prompt at a time).

`lookahead` and `generation` are the engine's own parameter classes
(lp.engine.LookaheadParams / GenerationParams). A job's `lookahead` defaults
are JOB_LOOKAHEAD (the fastest configuration measured for the embedded job on
a 2-core CPU), not the engine's own defaults (the paper's (15,5,15), no
lookup). Command-line overrides `--set section.key=value` are applied to the
raw mapping before checking; the
value is read as YAML (read_yaml: YAML 1.2 numbers such as 1e-3 included), so `--set data.limit=null` and
`--set generation.stop='["\\n\\n"]'` work.

Checking collects every problem and raises one ConfigError whose message has
one line per problem: `<section.key>: <value!r> <what is allowed>`. Types come
from the dataclass annotations (bool is not an int); ranges come from each
section's `problems()` method, the only place a section's rules live (the
engine checks the same rules again when called directly).

To grow the config: add a field (its annotation drives the type check) and its
rule in that section's problems(); a new section is a dataclass with
problems() registered in SECTIONS.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from lp.decode.kv_cache import COMPILE_MODES
from lp.engine import GenerationParams, LookaheadParams
from lp.jobs.code import CHAT_CODE_STOP, CODE_INSTRUCTION, RESPONSE_PREFIX, open_fence
from lp.messages import lone_surrogate, one_line, short_repr
from lp.models import ATTN_IMPLEMENTATIONS, CPU_LINEARS
from lp.models import DTYPES as _MODEL_DTYPES

DTYPES = tuple(_MODEL_DTYPES)  # what load_model accepts
DATA_SOURCES = ("humaneval", "classeval", "jsonl")
CODE_SOURCES = ("humaneval", "classeval")  # prompts that are code, with tests to evaluate completions
METHODS = ("lookahead", "autoregressive")
# the default stop strings of code-completion (HumanEval) jobs: the completion ends where the next
# top-level definition, script code, print or comment would begin
CODE_COMPLETION_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
# a lookahead job's requests per forward when it leaves generation.batch_size out: the measured best for the
# embedded job on the 2-core CPU, 2x the tokens/s of the best batched transformers generate with each request's
# latency p50 under 2x batch 1's (scripts/bench_batch.py; docs/benchmarks.md, "The shipped batch size")
JOB_BATCH_SIZE = 5
# a job's lookahead keys left out: the embedded job's settings, the fastest measured on the 2-core CPU
# (scripts/bench_core.py, docs/benchmarks.md "Token trees"): no Jacobi window, whose rows cost more than they
# return there, and one token tree per round of suffix drafts (up to 32 nodes, 8 x the match length,
# nodes continued by at least a tenth of the matches) from the request and the job's earlier completions
JOB_LOOKAHEAD = dict(window=0, ngram=4, guesses=0, pool_seeding=True,
                     lookup_candidates=0, lookup_tokens=16, lookup_ngram=3,
                     suffix_factor=8.0, suffix_tokens=32, suffix_min_score=0.1, job_cache=True)
# keys whose value does not change any results.jsonl record, so a job directory may be resumed with a
# config that differs only in these (see differences()): where results go and how they are checked, the
# split, and which prompts run, from where (a record is per task id, its prompt hash checked on resume,
# and the summary counts the records of the prompts selected now; a moved prompt file resumes, while
# data.source, which changes how an answer becomes a completion, does not)
RESULT_NEUTRAL_KEYS = frozenset({"output.dir", "output.evaluate", "output.evaluate_timeout_s",
                                 "distributed.backend", "distributed.timeout_s", "distributed.lp_size",
                                 "data.offset", "data.limit", "data.path"})
# keys of the chat mode alone: with data.chat_template false in both configs they change no record either
CHAT_ONLY_KEYS = frozenset({"data.instruction", "data.response_prefix"})
BACKENDS = ("auto", "gloo", "nccl")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


class ConfigError(ValueError):
    """A job config that cannot run; `problems` holds one line per problem."""

    def __init__(self, problems: Iterable[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"invalid config {source}" if source else "invalid config"
        n = len(self.problems)
        super().__init__(f"{head} ({n} problem{'s' if n != 1 else ''}):\n"
                         + "\n".join(f"  {p}" for p in self.problems))


@dataclass
class ModelSection:
    name: str = "smollm2-135m"
    dtype: str = "float32"
    device: str = "auto"
    compile: str = "off"      # off | default | reduce-overhead (CUDA graphs): torch.compile of the round forward
    # auto | onednn | torch: linear kernels on the CPU (lp.models.use_onednn_linears); auto is onednn for
    # eager forwards and torch with model.compile (inductor cannot lower a pre-packed weight it did not freeze)
    cpu_linear: str = "auto"
    # auto | sdpa | eager (lp.models.attention_implementation): auto is SDPA unless the model's attention
    # needs eager (soft-capped scores, attention sinks)
    attn_implementation: str = "auto"

    def load_kwargs(self) -> dict:
        """What lp.models.load_model takes from this section besides the name (device as configured)."""
        return dict(dtype=self.dtype, device=self.device, cpu_linear=self.linear_kernels(),
                    attn_implementation=self.attn_implementation)

    def linear_kernels(self) -> str:
        """What load_model's cpu_linear gets: 'onednn' or 'torch'."""
        return "onednn" if self.cpu_linear == "onednn" or (self.cpu_linear == "auto" and self.compile == "off") \
            else "torch"

    def problems(self) -> list[str]:
        out = []
        if self.compile not in COMPILE_MODES:
            out.append(f"model.compile: {self.compile!r} must be one of {', '.join(COMPILE_MODES)}")
        if self.cpu_linear not in ("auto", *CPU_LINEARS):
            out.append(f"model.cpu_linear: {self.cpu_linear!r} must be one of auto, {', '.join(CPU_LINEARS)}")
        elif self.cpu_linear == "onednn" and self.compile != "off":
            out.append(f"model.cpu_linear: 'onednn' cannot be compiled (model.compile: {self.compile!r}): torch."
                       f"compile lowers only weights it packs itself; use auto or torch")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            out.append(f"model.attn_implementation: {self.attn_implementation!r} must be one of "
                       f"{', '.join(ATTN_IMPLEMENTATIONS)}")
        if not self.name.strip():
            out.append(f"model.name: {self.name!r} must be a model name, a local directory or a .gguf path")
        if self.dtype not in DTYPES:
            out.append(f"model.dtype: {self.dtype!r} must be one of {', '.join(DTYPES)}")
        if not _DEVICE_RE.match(self.device):
            out.append(f"model.device: {self.device!r} must be auto, cpu, cuda or cuda:N")
        return out


@dataclass
class DataSection:
    source: str = "humaneval"
    path: str | None = None  # jsonl: one {"task_id": ..., "prompt": ...} per line; classeval: ClassEval_data.json
    offset: int = 0         # jsonl: counted in non-blank lines, good or bad
    limit: int | None = 20  # null: everything after offset
    # the chat code-completion mode (lp/jobs/code.py): the prompt in `instruction` as the user message of
    # the tokenizer's chat template, the answer opened with `response_prefix`, the code extracted from it
    chat_template: bool = True   # left out: true for the code sources, false for jsonl
    instruction: str = CODE_INSTRUCTION  # {prompt} marks where the prompt goes
    response_prefix: str = RESPONSE_PREFIX

    def problems(self) -> list[str]:
        out = []
        if self.source not in DATA_SOURCES:
            out.append(f"data.source: {self.source!r} must be one of {', '.join(DATA_SOURCES)}")
        if self.source == "jsonl" and not self.path:
            out.append(f"data.path: {self.path!r} must be the path of a .jsonl file when data.source is jsonl")
        if self.source == "classeval" and not self.path:
            out.append(f"data.path: {self.path!r} must be the path of ClassEval_data.json when data.source is "
                       f"classeval (from github.com/FudanSELab/ClassEval, data/ClassEval_data.json)")
        if self.source == "humaneval" and self.path:     # it would be ignored: the job decodes HumanEval
            out.append(f"data.path: {self.path!r} is not read when data.source is humaneval (the installed "
                       f"HumanEval); for a prompt file set data.source: jsonl (or classeval)")
        if self.chat_template and "{prompt}" not in self.instruction:      # the raw modes do not read it
            out.append(f"data.instruction: {short_repr(self.instruction)} must contain {{prompt}} (where the prompt "
                       f"goes)")
        if self.offset < 0:
            out.append(f"data.offset: {self.offset!r} must be >= 0")
        if self.limit is not None and self.limit < 1:
            out.append(f"data.limit: {self.limit!r} must be >= 1 or null (no limit)")
        return out


@dataclass
class OutputSection:
    dir: str = "runs/humaneval-smollm2"
    evaluate: bool = False            # run the HumanEval tests on the completions, pass@1 in the summary
    evaluate_timeout_s: float = 10.0  # per problem, a fresh Python process each

    def problems(self) -> list[str]:
        out = [] if self.dir.strip() else [f"output.dir: {self.dir!r} must be a non-empty path"]
        if not (math.isfinite(self.evaluate_timeout_s) and self.evaluate_timeout_s > 0):
            out.append(f"output.evaluate_timeout_s: {self.evaluate_timeout_s!r} must be a finite number > 0 "
                       f"(seconds)")
        return out


@dataclass
class DistributedSection:
    backend: str = "auto"      # auto: nccl when CUDA is available, else gloo
    timeout_s: float = 300.0   # collective timeout: a dead worker ends the others within this
    lp_size: int | None = None  # workers per LP group (null: the whole world); world / lp_size groups

    def problems(self) -> list[str]:
        out = []
        if self.backend not in BACKENDS:
            out.append(f"distributed.backend: {self.backend!r} must be one of {', '.join(BACKENDS)}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            out.append(f"distributed.timeout_s: {self.timeout_s!r} must be a finite number > 0 (seconds)")
        if self.lp_size is not None and self.lp_size < 1:
            out.append(f"distributed.lp_size: {self.lp_size!r} must be >= 1 or null (the world size)")
        return out


@dataclass
class BaselineSection:
    """Also decode every prompt autoregressively (transformers generate) in the same run."""
    enabled: bool = False

    def problems(self) -> list[str]:
        return []


@dataclass
class JobConfig:
    model: ModelSection = field(default_factory=ModelSection)
    lookahead: LookaheadParams = field(default_factory=lambda: LookaheadParams(**JOB_LOOKAHEAD))
    # the default data source is humaneval in the chat mode, whose default stop string is the closing fence
    generation: GenerationParams = field(default_factory=lambda: GenerationParams(stop=CHAT_CODE_STOP,
                                                                               batch_size=JOB_BATCH_SIZE))
    data: DataSection = field(default_factory=DataSection)
    output: OutputSection = field(default_factory=OutputSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    baseline: BaselineSection = field(default_factory=BaselineSection)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain YAML/JSON-ready mapping (tuples, nested ones included, become lists); load_config_dict
        inverts it."""
        return {name: {k: _lists(v) for k, v in dataclasses.asdict(getattr(self, name)).items()}
                for name in SECTIONS}

    def to_yaml(self) -> str:
        return yaml_text(self.to_dict())


def yaml_text(data: Any) -> str:
    """`data` as YAML that reads back to it (read_yaml): non-ASCII text as written, but where PyYAML would
    write a character its reader takes for a line break (U+0085, U+2028, U+2029 in a plain or
    single-quoted string), all of it escaped; text that read_yaml would read as a number ("1e5") quoted."""
    text = yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False, allow_unicode=True)
    return text if read_yaml(text) == data else yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False)


def _lists(value: Any) -> Any:
    """`value` with every tuple in it a list (YAML's safe dumper writes no tuples)."""
    return [_lists(v) for v in value] if isinstance(value, tuple) else value


SECTION_DEFAULTS: dict[str, dict[str, Any]] = {"lookahead": JOB_LOOKAHEAD}  # job defaults != class defaults

SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "lookahead": LookaheadParams,
    "generation": GenerationParams,
    "data": DataSection,
    "output": OutputSection,
    "distributed": DistributedSection,
    "baseline": BaselineSection,
}


def differences(recorded: JobConfig, current: JobConfig,
                ignore: Iterable[str] = RESULT_NEUTRAL_KEYS) -> list[str]:
    """`section.key: recorded -> current` for every key (not in `ignore`) whose value differs."""
    ignore = set(ignore)
    a, b = recorded.to_dict(), current.to_dict()
    if not (a["data"]["chat_template"] or b["data"]["chat_template"]):
        ignore |= CHAT_ONLY_KEYS
    out = []
    for name in SECTIONS:
        for key in a[name]:
            path = f"{name}.{key}"
            if path not in ignore and a[name][key] != b[name][key]:
                out.append(f"{path}: {short_repr(a[name][key], 40)} -> {short_repr(b[name][key], 40)}")
    return out

# ---------------------------------------------------------------- loading

def load_config(path: str | Path, overrides: Iterable[str] = ()) -> JobConfig:
    """Read a YAML job file, apply `section.key=value` overrides, check everything."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"config file not found: {path}"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError([f"config file {path} is not UTF-8 text (byte {e.start + 1}: {e.reason})"]) from None
    except OSError as e:
        raise ConfigError([f"cannot read config file {path}: {e.strerror or e}"]) from None
    try:
        raw = read_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"not valid YAML: {one_line(e, named=False)}"], source=str(path)) from None
    return load_config_dict(raw, overrides, source=str(path))


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key given twice in one mapping (safe_load keeps the last silently) and
    reads two kinds of scalar as YAML 1.2 does (integers and dates stay PyYAML's YAML 1.1): 1e-30 and 5E3
    are numbers (YAML 1.1 reads an exponent without a dot as a string, so `temperature: 1e-3` was refused
    as "must be a number"), and only true and false are booleans (YAML 1.1 also reads on, off, yes and no:
    `compile: off` was refused as "False must be a string")."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:       # a list or a mapping as a key: super() refuses it, naming its line
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} on line {line} was already given on line {seen[key]}")
            seen[key] = line
        return super().construct_mapping(node, deep)


class _ConfigDumper(yaml.SafeDumper):
    """yaml.safe_dump that quotes text read_yaml would read as a number (its resolver, below)."""


_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
for _cls in (_UniqueKeyLoader, _ConfigDumper):     # YAML 1.2's floats that YAML 1.1 misses: no dot, an exponent
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
_BOOL = "tag:yaml.org,2002:bool"       # YAML 1.2's booleans only (the dumper keeps quoting on, off, yes, no)
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in _UniqueKeyLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def read_yaml(text: str) -> Any:
    """A config's YAML (a file, a --set value, a sweep file): yaml.safe_load's reading with
    _UniqueKeyLoader's changes (a key given twice, YAML 1.2 floats and booleans)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def baseline_section(value: Any) -> Any:
    """`baseline: true` is short for `baseline: {enabled: true}`: the section's long form (other values as
    they are, for the checks to name)."""
    return {"enabled": value} if isinstance(value, bool) else value


def load_config_dict(raw: Any, overrides: Iterable[str] = (), *, source: str | None = None) -> JobConfig:
    """Build a checked JobConfig from a mapping (as read from YAML); see load_config."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([f"<top level>: {short_repr(raw)} must be a mapping of sections "
                           f"({', '.join(SECTIONS)})"], source)
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    if "baseline" in raw:
        raw["baseline"] = baseline_section(raw["baseline"])
    problems = apply_overrides(raw, overrides)

    sections = {}
    for name, section in raw.items():
        if name not in SECTIONS:
            problems.append(f"{name}: {short_repr(section)} is not a known section"
                            f"{_key_hint('', name, list(SECTIONS), _section_of_key())}; sections are "
                            f"{', '.join(SECTIONS)}")
        elif section is not None and not isinstance(section, dict):
            allowed = "true, false or a mapping of keys" if name == "baseline" else "a mapping of keys"
            problems.append(f"{name}: {short_repr(section)} must be {allowed}{_yaml11_hint(section)}")
    for name, cls in SECTIONS.items():
        section = raw.get(name)
        values, type_problems = check_types(name, cls, section if isinstance(section, dict) else {},
                                            _section_of_key(name))
        # a key with a wrong type keeps its default and gets no second line from the range rules
        sections[name] = cls(**{**SECTION_DEFAULTS.get(name, {}), **values})
        if name == "data" and not (isinstance(section, dict) and "chat_template" in section):
            sections[name].chat_template = sections[name].source in CODE_SOURCES
        mistyped = {line.split(":", 1)[0] for line in type_problems}
        problems += type_problems
        problems += [line for line in sections[name].problems() if line.split(":", 1)[0] not in mistyped]
    for section, key in (("data", "path"), ("output", "dir")):    # ~ is the home directory, as for model.name
        if isinstance(value := getattr(sections[section], key), str) and value.startswith("~"):
            setattr(sections[section], key, os.path.expanduser(value))
    generation = raw.get("generation")
    if not (isinstance(generation, dict) and "stop" in generation):
        sections["generation"].stop = default_stop(sections["data"])
    if not (isinstance(generation, dict) and "batch_size" in generation):
        sections["generation"].batch_size = default_batch_size(sections["generation"], sections["baseline"])
    problems += _cross_section_problems(sections)
    if problems:
        raise ConfigError(problems, source)
    return JobConfig(**sections)


def default_stop(data: DataSection) -> tuple[str, ...]:
    """`generation.stop` when the job leaves it out: in the chat mode the closing fence of the block the
    response prefix leaves open ("\\n```", CHAT_CODE_STOP, for the default prefix), none where it leaves
    none open (a fence would then stop the answer at its own opening fence, after a line of prose); the
    code-completion stop strings for raw code prompts; none for JSONL."""
    if data.chat_template:
        ticks = open_fence(data.response_prefix)
        return ("\n" + ticks,) if ticks else ()
    return CODE_COMPLETION_STOP if data.source in CODE_SOURCES else ()


def default_batch_size(generation: GenerationParams, baseline: BaselineSection) -> int:
    """`generation.batch_size` when the job leaves it out: JOB_BATCH_SIZE for lookahead without the in-run
    baseline, else 1 (both of those decode one prompt at a time)."""
    return JOB_BATCH_SIZE if generation.method == "lookahead" and not baseline.enabled else 1


def _cross_section_problems(sections: dict[str, Any]) -> list[str]:
    """Rules that involve keys of two sections."""
    out = []
    output, data, generation = sections["output"], sections["data"], sections["generation"]
    if generation.batch_size > 1 and generation.method != "lookahead":
        out.append(f"generation.batch_size: {generation.batch_size} needs generation.method lookahead "
                   f"(autoregressive decodes one prompt at a time with transformers generate)")
    if generation.batch_size > 1 and sections["baseline"].enabled:
        out.append(f"baseline.enabled: true compares one prompt at a time and needs generation.batch_size 1 "
                   f"(it is {generation.batch_size})")
    if output.evaluate and data.source not in CODE_SOURCES:
        out.append(f"output.evaluate: {output.evaluate!r} needs data.source {' or '.join(CODE_SOURCES)} (the "
                   f"tests come with the problems); data.source is {data.source!r}")
    return out


def environment_problems(cfg: JobConfig, world_size: int, cuda: bool) -> list[str]:
    """Rules that depend on where the job runs: `world_size` ranks (torchrun's WORLD_SIZE; 1 without
    torchrun) and whether CUDA is available."""
    out = []
    if cfg.distributed.backend == "nccl" and not cuda:
        out.append("distributed.backend: 'nccl' needs CUDA, and this machine has none; use gloo or auto")
    if world_size > 1 and re.fullmatch(r"cuda:\d+", cfg.model.device):
        out.append(f"model.device: {cfg.model.device!r} names one GPU, but under torchrun rank k always uses "
                   f"cuda:LOCAL_RANK; use cuda or auto (CUDA_VISIBLE_DEVICES chooses which GPUs)")
    lp = cfg.distributed.lp_size
    if lp is not None and lp >= 1 and world_size % lp:
        out.append(f"distributed.lp_size: {lp!r} must divide the world size {world_size} "
                   f"(the workers form world_size / lp_size LP groups of lp_size)")
    if cfg.model.device.startswith("cuda") and not cuda:
        out.append(f"model.device: {cfg.model.device!r} needs CUDA, and this machine has none; use cpu or auto")
    if cfg.model.compile == "reduce-overhead" and not cuda:
        out.append("model.compile: 'reduce-overhead' captures CUDA graphs and needs CUDA; use default or off")
    return out


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> list[str]:
    """Apply `section.key=value` strings to raw in place; returns the malformed ones as problems."""
    problems = []
    for item in overrides:
        target, sep, text = item.partition("=")
        parts = target.strip().split(".")
        shorthand = parts == ["baseline"]  # --set baseline=true, like `baseline: true` in a file
        if not sep or (len(parts) != 2 and not shorthand) or not all(parts):
            section = _section_of_key().get(parts[-1]) if sep and len(parts) == 1 else None
            problems.append(f"--set {item!r}: expected section.key=value (e.g. lookahead.window=7)"
                            + (f"; {parts[0]} belongs in {section}: --set {section}.{item.strip()}" if section else ""))
            continue
        try:
            value = read_yaml(text)
        except yaml.YAMLError as e:
            problems.append(f"--set {item!r}: the value is not valid YAML: {one_line(e, named=False)}")
            continue
        if shorthand:
            raw["baseline"] = baseline_section(value)
            continue
        name, key = parts
        section = raw.get(name)
        if section is None:
            section = raw[name] = {}
        if isinstance(section, dict):
            section[key] = value
        # a non-mapping section is reported by the section check
    return problems


# keys put in the section of a neighbouring idea: what they most likely meant
_MEANT = {("model", "path"): "model.name",      # it takes a local directory or a .gguf file too
          ("output", "path"): "output.dir", ("data", "dir"): "data.path"}


def _key_hint(name: str, key: Any, known: list[str], elsewhere: dict[str, str] | None) -> str:
    """' (it belongs in <section>: <section>.<key>)' or ' (did you mean <name>.<key>?)' for an unknown key
    (a section's name when `name` is ''), else ''."""
    if not isinstance(key, str):
        return ""
    if (name, key) in _MEANT:
        return f" (did you mean {_MEANT[name, key]}?)"
    if elsewhere and key in elsewhere:
        return f" (it belongs in {elsewhere[key]}: {elsewhere[key]}.{key})"
    close = close_key(key, known)
    return f" (did you mean {name + '.' if name else ''}{close}?)" if close else ""


def close_key(key: str, known: Iterable[str]) -> str | None:
    """The known key `key` is most likely a misspelling of, if any."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return close[0] if close else None


def _section_of_key(besides: str = "") -> dict[str, str]:
    """key -> the section it belongs to, over every section but `besides`."""
    return {f.name: section for section, cls in SECTIONS.items() if section != besides
            for f in dataclasses.fields(cls)}


def check_types(name: str, cls: type, given: dict[str, Any],
                elsewhere: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The keys of one section that are known and well typed, and a problem line for each other key (an
    unknown one with the section `elsewhere` maps it to, or else a close spelling of a known key)."""
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    problems = []
    for key, value in given.items():
        path = f"{name}.{key}"
        if key not in known:
            problems.append(f"{path}: {short_repr(value)} is not a known key{_key_hint(name, key, known, elsewhere)}; "
                            f"{name} keys are {', '.join(known)}")
            continue
        ok, converted, expected = _check_type(value, hints[key])
        if ok:
            values[key] = converted
        else:
            problems.append(f"{path}: {short_repr(value)} must be {expected}")
    return values, problems


def _float_sized(number: int | float) -> bool:
    """Whether `number` converts to a float (an integer past 1.8e308 does not)."""
    try:
        float(number)
    except OverflowError:
        return False
    return True


_UNICODE = " of Unicode text (no lone surrogate escape)"     # said only of a value that is a string already


def _text(value: Any) -> bool:
    """A string that every file lp writes can hold: no lone surrogate (YAML's and JSON's \\ud800 escapes)."""
    return isinstance(value, str) and lone_surrogate(value) is None


def _yaml11_hint(value: Any) -> str:
    """Where a boolean was written as YAML 1.1 spells one (yes, off, ...), why it is text here."""
    if isinstance(value, str) and value.lower() in ("yes", "no", "on", "off"):
        return " (lp reads YAML 1.2, where yes, no, on and off are text)"
    return ""


def _check_type(value: Any, tp: Any) -> tuple[bool, Any, str]:
    """(accepted, converted value, description of what is allowed) for the types configs use."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None and len(inner) < len(args):
            return True, None, ""
        ok, conv, what = _check_type(value, inner[0]) if len(inner) == 1 else (False, value, "?")
        return ok, conv, f"{what} or null"
    if tp is bool:
        return isinstance(value, bool), value, "true or false" + _yaml11_hint(value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value, "an integer"
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _float_sized(value)
        return ok, float(value) if ok else value, "a number"
    if tp is str:
        return _text(value), value, "a string" + (_UNICODE if isinstance(value, str) else "")
    if origin in (tuple, list) and args and args[0] is str:
        ok = isinstance(value, list) and all(_text(v) for v in value)
        strings = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return ok, (tuple(value) if origin is tuple else list(value)) if ok else value, \
            "a list of strings" + (_UNICODE if strings else "")
    if origin is tuple and args and args[0] is int:       # token ids
        ok = isinstance(value, (list, tuple)) and all(_check_type(t, int)[0] for t in value)
        return ok, tuple(value) if ok else value, "a list of token ids"
    if origin is tuple and args and typing.get_args(args[0])[-1:] == (float,):       # (token ids, bias) pairs
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[0], (list, tuple))
            and all(_check_type(t, int)[0] for t in e[0]) and _check_type(e[1], float)[0] for e in value)
        return ok, tuple((tuple(e[0]), float(e[1])) for e in value) if ok else value, \
            "a list of [token ids, bias] pairs"
    if origin is tuple and args and typing.get_origin(args[0]) is tuple:      # token id sequences
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(w, (list, tuple)) and all(_check_type(t, int)[0] for t in w) for w in value)
        return ok, tuple(tuple(w) for w in value) if ok else value, "a list of lists of token ids"
    raise TypeError(f"config type {tp!r} has no checker")  # a new field type: teach _check_type



"""Job config: bad configs exit 2 naming the key, good configs round-trip, --set works."""
from __future__ import annotations

import json
import textwrap

import pytest
import yaml
from click.testing import CliRunner

from pathlib import Path

import lp.run
from lp.jobs.code import CHAT_CODE_STOP, CODE_INSTRUCTION, RESPONSE_PREFIX
from lp.jobs.config import (CODE_COMPLETION_STOP, JOB_BATCH_SIZE, JOB_LOOKAHEAD, ConfigError, JobConfig, differences,
                       load_config, load_config_dict, read_yaml, yaml_text)
from lp.engine import LookaheadParams
from lp.run import main

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JOB = str(ROOT / "configs" / "humaneval-smollm2.yaml")
SHIPPED = sorted(str(p) for p in ROOT.glob("configs/*.yaml"))

# (id, config mapping, --set overrides, key path the message must name)
BAD = [
    ("unknown-section", {"modle": {"name": "x"}}, [], "modle:"),
    ("unknown-key", {"lookahead": {"windw": 7}}, [], "lookahead.windw:"),
    ("section-not-mapping", {"lookahead": 7}, [], "lookahead:"),
    ("window-negative", {"lookahead": {"window": -1}}, [], "lookahead.window:"),
    ("lookup-tokens-zero", {"lookahead": {"lookup_tokens": 0}}, [], "lookahead.lookup_tokens:"),
    ("lookup-ngram-zero", {"lookahead": {"lookup_ngram": 0}}, [], "lookahead.lookup_ngram:"),
    ("lookup-candidates-negative", {"lookahead": {"lookup_candidates": -2}}, [], "lookahead.lookup_candidates:"),
    ("suffix-factor-negative", {"lookahead": {"suffix_factor": -1}}, [], "lookahead.suffix_factor:"),
    ("suffix-factor-string", {"lookahead": {"suffix_factor": "8x"}}, [], "lookahead.suffix_factor:"),
    ("suffix-tokens-zero", {"lookahead": {"suffix_tokens": 0}}, [], "lookahead.suffix_tokens:"),
    ("suffix-min-score-above-one", {"lookahead": {"suffix_min_score": 1.5}}, [], "lookahead.suffix_min_score:"),
    ("job-cache-string", {"lookahead": {"job_cache": "on"}}, [], "lookahead.job_cache:"),
    ("tree-budget-negative", {"lookahead": {"tree_budget": -4}}, [], "lookahead.tree_budget:"),
    ("window-string", {"lookahead": {"window": "15"}}, [], "lookahead.window:"),
    ("window-float", {"lookahead": {"window": 1.5}}, [], "lookahead.window:"),
    ("ngram-bool", {"lookahead": {"ngram": True}}, [], "lookahead.ngram:"),
    ("ngram-two", {"lookahead": {"ngram": 2}}, [], "lookahead.ngram:"),
    ("guesses-negative", {"lookahead": {"guesses": -1}}, [], "lookahead.guesses:"),
    ("pool-seeding-int", {"lookahead": {"pool_seeding": 1}}, [], "lookahead.pool_seeding:"),
    ("pool-seeding-string", {"lookahead": {"pool_seeding": "yes"}}, [], "lookahead.pool_seeding:"),
    ("max-new-tokens-zero", {"generation": {"max_new_tokens": 0}}, [], "generation.max_new_tokens:"),
    ("max-new-tokens-bool", {"generation": {"max_new_tokens": False}}, [], "generation.max_new_tokens:"),
    ("stop-string", {"generation": {"stop": "\n\n"}}, [], "generation.stop:"),
    ("stop-empty-string", {"generation": {"stop": [""]}}, [], "generation.stop:"),
    ("stop-number", {"generation": {"stop": [3]}}, [], "generation.stop:"),
    ("dtype", {"model": {"dtype": "float8"}}, [], "model.dtype:"),
    ("device", {"model": {"device": "gpu"}}, [], "model.device:"),
    ("device-index", {"model": {"device": "cuda:x"}}, [], "model.device:"),
    ("compile", {"model": {"compile": "max"}}, [], "model.compile:"),
    ("compile-bool", {"model": {"compile": True}}, [], "model.compile:"),
    ("cpu-linear", {"model": {"cpu_linear": "mkl"}}, [], "model.cpu_linear:"),
    ("cpu-linear-compiled", {"model": {"cpu_linear": "onednn", "compile": "default"}}, [], "model.cpu_linear:"),
    ("attn-implementation", {"model": {"attn_implementation": "flash_attention_2"}}, [],
     "model.attn_implementation:"),
    ("name-empty", {"model": {"name": ""}}, [], "model.name:"),
    ("name-number", {"model": {"name": 135}}, [], "model.name:"),
    ("source", {"data": {"source": "mbpp"}}, [], "data.source:"),
    ("jsonl-needs-path", {"data": {"source": "jsonl"}}, [], "data.path:"),
    ("offset-negative", {"data": {"offset": -1}}, [], "data.offset:"),
    ("limit-zero", {"data": {"limit": 0}}, [], "data.limit:"),
    ("limit-string", {"data": {"limit": "all"}}, [], "data.limit:"),
    ("output-dir-empty", {"output": {"dir": ""}}, [], "output.dir:"),
    ("backend", {"distributed": {"backend": "mpi"}}, [], "distributed.backend:"),
    ("timeout-zero", {"distributed": {"timeout_s": 0}}, [], "distributed.timeout_s:"),
    ("timeout-string", {"distributed": {"timeout_s": "5m"}}, [], "distributed.timeout_s:"),
    ("timeout-inf", {}, ["distributed.timeout_s=.inf"], "distributed.timeout_s:"),
    ("timeout-nan", {"distributed": {"timeout_s": float("nan")}}, [], "distributed.timeout_s:"),
    ("set-bad-range", {}, ["lookahead.window=-3"], "lookahead.window:"),
    ("set-bad-type", {}, ["lookahead.pool_seeding=maybe"], "lookahead.pool_seeding:"),
    ("set-unknown-key", {}, ["generation.beam_size=4"], "generation.beam_size:"),
    ("set-unknown-section", {}, ["sampling.top_k=5"], "sampling:"),
    ("set-no-equals", {}, ["lookahead.window"], "--set 'lookahead.window'"),
    ("set-no-dot", {}, ["window=7"], "--set 'window=7'"),
    ("set-bad-yaml", {}, ["generation.stop=[unclosed"], "--set 'generation.stop=[unclosed'"),
    ("method-unknown", {"generation": {"method": "beam"}}, [], "generation.method:"),
    ("method-number", {"generation": {"method": 1}}, [], "generation.method:"),
    ("set-method", {}, ["generation.method=speculative"], "generation.method:"),
    ("chat-template-string", {"data": {"chat_template": "yes"}}, [], "data.chat_template:"),
    ("chat-template-int", {"data": {"chat_template": 1}}, [], "data.chat_template:"),
    ("classeval-needs-path", {"data": {"source": "classeval"}}, [], "data.path:"),
    ("instruction-without-prompt", {"data": {"instruction": "Complete this code."}}, [], "data.instruction:"),
    ("instruction-number", {"data": {"instruction": 5}}, [], "data.instruction:"),
    ("instruction-null", {}, ["data.instruction=null"], "data.instruction:"),
    ("response-prefix-list", {"data": {"response_prefix": ["```"]}}, [], "data.response_prefix:"),
    ("response-prefix-null", {}, ["data.response_prefix=null"], "data.response_prefix:"),
    ("evaluate-string", {"output": {"evaluate": "true"}}, [], "output.evaluate:"),
    ("evaluate-jsonl", {"output": {"evaluate": True}, "data": {"source": "jsonl", "path": "p.jsonl"}}, [],
     "output.evaluate:"),
    ("evaluate-timeout-zero", {"output": {"evaluate_timeout_s": 0}}, [], "output.evaluate_timeout_s:"),
    ("evaluate-timeout-string", {"output": {"evaluate_timeout_s": "10s"}}, [], "output.evaluate_timeout_s:"),
    ("evaluate-timeout-inf", {"output": {"evaluate_timeout_s": float("inf")}}, [], "output.evaluate_timeout_s:"),
    ("baseline-string", {"baseline": "yes"}, [], "baseline:"),
    ("baseline-number", {"baseline": 1}, [], "baseline:"),
    ("baseline-unknown-key", {"baseline": {"enable": True}}, [], "baseline.enable:"),
    ("baseline-enabled-string", {"baseline": {"enabled": "on"}}, [], "baseline.enabled:"),
    ("set-baseline", {}, ["baseline.enabled=maybe"], "baseline.enabled:"),
    ("set-baseline-shorthand", {}, ["baseline=3"], "baseline:"),
    ("set-other-shorthand", {}, ["lookahead=7"], "--set 'lookahead=7'"),
    ("temperature-negative", {"generation": {"temperature": -0.5}}, [], "generation.temperature:"),
    ("temperature-string", {"generation": {"temperature": "hot"}}, [], "generation.temperature:"),
    ("temperature-nan", {"generation": {"temperature": float("nan")}}, [], "generation.temperature:"),
    ("temperature-inf", {}, ["generation.temperature=.inf"], "generation.temperature:"),
    ("suffix-factor-inf", {"lookahead": {"suffix_factor": float("inf")}}, [], "lookahead.suffix_factor:"),
    ("top-k-negative", {"generation": {"top_k": -1}}, [], "generation.top_k:"),
    ("top-p-negative", {"generation": {"top_p": -0.1}}, [], "generation.top_p:"),
    ("min-p-above-one", {"generation": {"min_p": 1.5}}, [], "generation.min_p:"),
    ("penalty-zero", {"generation": {"repetition_penalty": 0}}, [], "generation.repetition_penalty:"),
    ("penalty-nan", {"generation": {"repetition_penalty": float("nan")}}, [], "generation.repetition_penalty:"),
    ("min-new-negative", {"generation": {"min_new_tokens": -1}}, [], "generation.min_new_tokens:"),
    ("ngram-negative", {"generation": {"no_repeat_ngram_size": -1}}, [], "generation.no_repeat_ngram_size:"),
    ("bad-words-flat", {"generation": {"bad_words_ids": [3, 4]}}, [], "generation.bad_words_ids:"),
    ("bad-words-empty-word", {"generation": {"bad_words_ids": [[3], []]}}, [], "generation.bad_words_ids:"),
    ("bad-words-negative", {"generation": {"bad_words_ids": [[-3]]}}, [], "generation.bad_words_ids:"),
    ("top-p-above-one", {"generation": {"top_p": 1.5}}, [], "generation.top_p:"),
    ("top-h-negative", {"generation": {"top_h": -0.5}}, [], "generation.top_h:"),
    ("typical-zero", {"generation": {"typical_p": 0}}, [], "generation.typical_p: 0.0 must be in (0, 1] (1 is off)"),
    ("epsilon-one", {"generation": {"epsilon_cutoff": 1}}, [], "generation.epsilon_cutoff: 1.0 must be in [0, 1)"),
    ("eta-nan", {"generation": {"eta_cutoff": float("nan")}}, [], "generation.eta_cutoff:"),
    ("suppress-nested", {"generation": {"suppress_tokens": [[3]]}}, [], "generation.suppress_tokens:"),
    ("suppress-negative", {"generation": {"suppress_tokens": [4, -1]}}, [], "generation.suppress_tokens:"),
    ("begin-suppress-negative", {"generation": {"begin_suppress_tokens": [-2]}}, [], "generation.begin_suppress_tokens:"),
    ("forced-eos-negative", {"generation": {"forced_eos_token_id": [-1]}}, [], "generation.forced_eos_token_id:"),
    ("forced-eos-suppressed", {"generation": {"forced_eos_token_id": [4], "suppress_tokens": [4, 5]}}, [],
     "generation.forced_eos_token_id: [4] are all in suppress_tokens"),
    ("bias-flat", {"generation": {"sequence_bias": [[1, 2.0]]}}, [], "generation.sequence_bias: [[1, 2.0]] must be"),
    ("bias-empty-ids", {"generation": {"sequence_bias": [[[], 2.0]]}}, [], "generation.sequence_bias: [[], 2.0]"),
    ("bias-overlap", {"generation": {"sequence_bias": [[[1, 2, 3], 1.0], [[2, 3], 2.0]]}}, [],
     "generation.sequence_bias: [1, 2, 3] and [2, 3] can complete on the same token"),
    ("seed-negative", {"generation": {"seed": -3}}, [], "generation.seed:"),
    ("seed-float", {"generation": {"seed": 1.5}}, [], "generation.seed:"),
    ("temperature-past-floats", {}, ["generation.temperature=1" + "0" * 400], "generation.temperature:"),
    ("bias-past-floats", {}, ["generation.sequence_bias=[[[3], 1" + "0" * 400 + "]]"], "generation.sequence_bias:"),
    ("instruction-surrogate", {}, ['data.instruction="{prompt}\\ud800"'],      # YAML's escape: no UTF-8 holds it
     "data.instruction: '{prompt}\\ud800' must be a string of Unicode text"),
    ("stop-surrogate", {}, ['generation.stop=["a\\udc00"]'], "generation.stop:"),
]


def write(tmp_path, mapping, name="job.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(mapping))
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("mapping,overrides,key", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_exits_2_naming_the_key(tmp_path, monkeypatch, mapping, overrides, key):
    def accepted(*args, **kwargs):
        raise AssertionError("the bad config was accepted")  # fail fast instead of running a job
    monkeypatch.setattr(lp.run, "run_job", accepted)
    mapping = {"output": {"dir": str(tmp_path / "out")}} | mapping
    args = ["--config", write(tmp_path, mapping)]
    for item in overrides:
        args += ["--set", item]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert any(line.strip().startswith(key) for line in result.stderr.splitlines()), result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "out").exists()  # nothing was run


def test_all_problems_are_reported_one_line_each(tmp_path):
    mapping = {
        "model": {"dtype": "int4", "device": "tpu"},
        "lookahead": {"window": -1, "ngram": "5", "guesses": -3, "pool_seeding": 0, "level": 2},
        "generation": {"max_new_tokens": -1, "method": "greedy"},
        "data": {"source": "jsonl", "offset": -2, "limit": 0},
        "output": {"evaluate": True},
        "baseline": {"enabled": 1},
        "extra": {},
    }
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, mapping))
    keys = [line.split(":", 1)[0] for line in err.value.problems]
    assert sorted(keys) == sorted([
        "model.dtype", "model.device", "lookahead.window", "lookahead.ngram", "lookahead.guesses",
        "lookahead.pool_seeding", "lookahead.level", "generation.max_new_tokens", "generation.method",
        "data.path", "data.offset", "data.limit", "output.evaluate", "baseline.enabled", "extra",
    ])
    message_lines = str(err.value).splitlines()[1:]
    assert [line.strip() for line in message_lines] == err.value.problems
    # each line: `<key path>: <value!r> <what is allowed>`
    assert "lookahead.window: -1 must be >= 0 (0: no Jacobi window)" in err.value.problems
    assert "lookahead.ngram: '5' must be an integer" in err.value.problems


def test_unknown_key_names_its_section_or_close_spelling(tmp_path):
    """A key put in the wrong section names the section it belongs to; a misspelt key or section names the
    close known one; a key like no other gets neither."""
    mapping = {"generation": {"window": 3, "max_new_token": 8}, "model": {"temperature": 0.5, "path": "m"},
               "lookahead": {"zzz": 1}, "generaton": {}, "max_new_tokens": 9, "data": {"dir": "d"}}
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, mapping))
    lines = {line.split(":", 1)[0]: line for line in err.value.problems}
    assert "is not a known key (it belongs in lookahead: lookahead.window); generation keys are" in \
        lines["generation.window"]
    assert "(did you mean generation.max_new_tokens?)" in lines["generation.max_new_token"]
    assert "(it belongs in generation: generation.temperature)" in lines["model.temperature"]
    assert "is not a known key; lookahead keys are" in lines["lookahead.zzz"]
    assert "(did you mean model.name?)" in lines["model.path"]        # not data.path: that is the prompt file
    assert "(did you mean data.path?)" in lines["data.dir"]
    assert "is not a known section (did you mean generation?)" in lines["generaton"]
    assert "is not a known section (it belongs in generation: generation.max_new_tokens)" in lines["max_new_tokens"]


def test_numbers_with_an_exponent_and_no_dot_are_numbers(tmp_path):
    """PyYAML reads 1e-3 (YAML 1.2's float) as a string: `temperature: 5e-1` in a file or --set
    generation.temperature=1e-30 was refused as "'1e-30' must be a number". A quoted one stays a string."""
    cfg = load_config(write(tmp_path, {}), ["generation.temperature=5e-1", "distributed.timeout_s=1E3"])
    assert cfg.generation.temperature == 0.5 and cfg.distributed.timeout_s == 1000.0
    path = tmp_path / "exp.yaml"
    path.write_text("generation:\n  temperature: 1e-30\n  top_p: .9e0\n")
    assert (load_config(path).generation.temperature, load_config(path).generation.top_p) == (1e-30, 0.9)
    with pytest.raises(ConfigError, match="generation.temperature: '1e-3' must be a number"):
        load_config(write(tmp_path, {}), ["generation.temperature='1e-3'"])


def test_a_tilde_in_paths_is_the_home_directory(tmp_path, monkeypatch):
    """output.dir and data.path starting with ~ made a directory named '~' where the job ran."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config(write(tmp_path, {"data": {"source": "jsonl", "path": "~/p.jsonl"}, "output": {"dir": "~/out"}}))
    assert (cfg.data.path, cfg.output.dir) == (str(tmp_path / "home" / "p.jsonl"), str(tmp_path / "home" / "out"))


def test_only_true_and_false_are_booleans(tmp_path):
    """YAML 1.1 reads off, on, yes and no as booleans: `model.compile: off`, as the docs write it, was
    refused as "False must be a string", and `baseline.enabled: yes` taken for true. Read as YAML 1.2 they
    are text: compile's off is off, and a boolean key given yes is named with why."""
    assert load_config(write(tmp_path, {}), ["model.compile=off"]).model.compile == "off"
    path = tmp_path / "y.yaml"
    path.write_text("model:\n  compile: off\nbaseline: on\nlookahead:\n  job_cache: yes\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    why = "(lp reads YAML 1.2, where yes, no, on and off are text)"
    assert sorted(err.value.problems) == [f"baseline: 'on' must be true, false or a mapping of keys {why}",
                                          f"lookahead.job_cache: 'yes' must be true or false {why}"]
    assert load_config(write(tmp_path, {}), ["baseline=true", "lookahead.job_cache=False"]).baseline.enabled


def test_text_that_reads_as_a_number_is_quoted_in_config_yaml(tmp_path):
    """read_yaml takes 1e5 for a number: config.yaml wrote the stop string "1e5" bare, and the resume read
    it back as 100000.0 and refused the recorded config."""
    given = tmp_path / "job.yaml"
    given.write_text('generation:\n  stop: ["1e5", x]\nmodel:\n  name: "2E3"\n')
    cfg = load_config(given)
    recorded = tmp_path / "config.yaml"
    recorded.write_text(cfg.to_yaml())
    again = load_config(recorded)
    assert again.generation.stop == ("1e5", "x") and again.model.name == "2E3" and again == cfg


def test_a_prompt_file_with_the_humaneval_source_is_refused(tmp_path):
    """data.path with data.source left at humaneval was silently ignored: the job decoded HumanEval."""
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {"data": {"path": "prompts.jsonl"}}))
    assert err.value.problems == ["data.path: 'prompts.jsonl' is not read when data.source is humaneval (the "
                                  "installed HumanEval); for a prompt file set data.source: jsonl (or classeval)"]
    assert load_config(write(tmp_path, {"data": {"source": "jsonl", "path": "prompts.jsonl"}})).data.path


def test_lookahead_sizes_have_a_ceiling(tmp_path):
    """Sizes past what any device holds (which overflowed the allocator's arithmetic or asked it for
    100+ GB in a traceback) are config problems; the ceiling itself is allowed."""
    from lp.decode.params import COUNT_KEYS, MOST_COUNT

    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {"lookahead": {key: 2**32 for key in COUNT_KEYS}}))
    assert sorted(err.value.problems) == sorted(f"lookahead.{key}: {2**32} must be at most {MOST_COUNT}"
                                                for key in COUNT_KEYS)
    assert load_config(write(tmp_path, {"lookahead": {"window": MOST_COUNT}})).lookahead.window == MOST_COUNT


def test_mistyped_key_is_reported_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {"data": {"source": "jsonl", "path": 5}}))
    assert err.value.problems == ["data.path: 5 must be a string or null"]


@pytest.mark.parametrize("text,needle", [
    ("model: [unclosed\n", "not valid YAML"),
    ("- just\n- a list\n", "<top level>"),
    ("model: {name: x}\n  bad indent: 1\n", "not valid YAML"),
    ("generation:\n  max_new_tokens: 8\n  max_new_tokens: 16\n",   # safe_load would keep 16 silently
     "key 'max_new_tokens' on line 3 was already given on line 2"),
    ("model: {name: x}\nmodel: {dtype: float64}\n", "key 'model' on line 2 was already given on line 1"),
    ("model:\n  ? [a, b]\n  : 1\n", "found unhashable key"),       # a list as a key
])
def test_unreadable_config_exits_2(tmp_path, text, needle):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = invoke("--config", path)
    assert result.exit_code == 2
    assert needle in result.stderr and "Traceback" not in result.output


def test_config_that_is_not_utf8_exits_2(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"model: {name: caf\xe9}\n")  # Latin-1, as an editor on another machine might save it
    result = invoke("--config", path)
    assert result.exit_code == 2
    assert "not UTF-8" in result.stderr and "job.yaml" in result.stderr and "Traceback" not in result.output


def test_missing_config_file_exits_2(tmp_path):
    result = invoke("--config", tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert "config file not found" in result.stderr and "nope.yaml" in result.stderr


def test_force_and_fresh_together_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(lp.run, "run_job", lambda *a, **k: pytest.fail("the job ran"))
    result = invoke("--config", write(tmp_path, {}), "--force", "--fresh")
    assert result.exit_code == 2 and "--force" in result.output and "--fresh" in result.output


def test_missing_config_option_exits_2():
    result = invoke()
    assert result.exit_code == 2
    assert "--config" in result.output


def test_default_job_is_the_embedded_default():
    cfg = load_config(DEFAULT_JOB)
    assert cfg == JobConfig() == load_config_dict({})
    assert cfg.model.name == "smollm2-135m" and cfg.model.device == "auto"
    assert cfg.lookahead == LookaheadParams(**JOB_LOOKAHEAD) != LookaheadParams()
    assert cfg.lookahead.suffix and cfg.lookahead.job_cache and cfg.lookahead.window == 0
    assert cfg.generation.max_new_tokens == 256 and cfg.generation.method == "lookahead"
    assert cfg.generation.stop == CHAT_CODE_STOP == ("\n```",)  # the chat mode's closing fence
    assert (cfg.data.source, cfg.data.offset, cfg.data.limit) == ("humaneval", 0, 20)
    assert cfg.data.chat_template is True and cfg.output.evaluate is False and cfg.baseline.enabled is False
    assert (cfg.data.instruction, cfg.data.response_prefix) == (CODE_INSTRUCTION, RESPONSE_PREFIX)


@pytest.mark.parametrize("data", [{"chat_template": False}, {"source": "jsonl", "path": "p.jsonl"}])
def test_an_instruction_without_its_prompt_is_refused_only_where_it_is_read(data):
    """Only the chat mode reads data.instruction: a raw-mode job (said so, or by jsonl's default) takes
    any text there; the chat mode (said so, or by the code sources' default) refuses one without {prompt}."""
    cfg = load_config_dict({"data": {**data, "instruction": "Complete this code."}})
    assert cfg.data.chat_template is False and cfg.data.instruction == "Complete this code."
    for chat in ({"chat_template": True}, {}):
        with pytest.raises(ConfigError, match=r"data.instruction: .* must contain \{prompt\}"):
            load_config_dict({"data": {**chat, "instruction": "Complete this code."}})


def test_code_completion_stop_strings():
    assert CODE_COMPLETION_STOP == ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")


def test_shipped_configs_are_all_tested():
    names = {Path(p).name for p in SHIPPED}
    assert {"humaneval-smollm2.yaml", "humaneval-smollm2-full.yaml", "example-jsonl.yaml",
            "classeval-smollm2.yaml", "codellama-7b-instruct-classeval.yaml"} <= names
    assert any("codellama" in n for n in names)


@pytest.mark.parametrize("stop", ["\x85", "a\u2028b", "\u2029", "é ü 中"])
def test_text_round_trips_through_the_written_config(tmp_path, stop):
    """config.yaml reads back to the config it was written from, so the same command resumes: PyYAML writes
    U+0085, U+2028 and U+2029 raw and reads them back as line breaks (before, a stop string holding one
    refused its own resume as a changed config, and a sweep's point ran another config than the one it
    checked); other non-ASCII text stays as written."""
    cfg = load_config(SHIPPED[0], ["generation.stop=" + json.dumps([stop])])
    assert cfg.generation.stop == (stop,)
    again = tmp_path / "again.yaml"
    again.write_text(cfg.to_yaml(), encoding="utf-8")
    assert load_config(again) == cfg
    if stop.isprintable():
        assert stop in cfg.to_yaml()
    point = {"base": {"generation": {"stop": [stop]}}}      # a sweep point's raw config, written the same way
    assert yaml.safe_load(yaml_text(point)) == point


@pytest.mark.parametrize("path", SHIPPED, ids=[Path(p).name for p in SHIPPED])
def test_shipped_configs_are_valid_and_round_trip(tmp_path, path):
    cfg = load_config(path)
    again = tmp_path / "again.yaml"
    again.write_text(cfg.to_yaml())
    assert load_config(again) == cfg
    assert load_config_dict(cfg.to_dict()) == cfg
    assert cfg.output.dir.startswith("runs/")
    if cfg.data.source == "jsonl":
        assert (Path(__file__).resolve().parents[1] / cfg.data.path).is_file()
    if cfg.data.source == "classeval":  # not shipped: where docs/configuration.md ("ClassEval") says to put it
        assert cfg.data.path == "data/ClassEval_data.json"


def test_gpu_configs_use_the_paper_settings_on_cuda():
    gpu = [load_config(p) for p in SHIPPED if load_config(p).model.device.startswith("cuda")]
    assert len(gpu) >= 2
    for cfg in gpu:
        assert cfg.model.dtype in ("float16", "bfloat16")
        assert (cfg.lookahead.window, cfg.lookahead.ngram, cfg.lookahead.guesses) == (15, 5, 15)
        assert cfg.data.source in ("humaneval", "classeval") and cfg.data.limit is None and cfg.baseline.enabled
        # instruct models in the chat mode (stop at the closing fence), base models on raw prompts
        assert cfg.data.chat_template is ("Instruct" in cfg.model.name)
        assert cfg.generation.stop == (CHAT_CODE_STOP if cfg.data.chat_template else CODE_COMPLETION_STOP)


JSONL = {"source": "jsonl", "path": "p.jsonl"}
CLASSEVAL = {"source": "classeval", "path": "ClassEval_data.json"}


@pytest.mark.parametrize("mapping,stop", [
    ({}, CHAT_CODE_STOP),                                                          # humaneval: chat mode
    ({"generation": {"max_new_tokens": 8}}, CHAT_CODE_STOP),
    ({"data": {"chat_template": False}}, CODE_COMPLETION_STOP),                    # raw code prompts
    ({"data": CLASSEVAL}, CHAT_CODE_STOP),
    ({"data": {**CLASSEVAL, "chat_template": False}}, CODE_COMPLETION_STOP),
    ({"generation": {"stop": []}}, ()),                                            # [] means none
    ({"generation": {"stop": ["\n\n"]}}, ("\n\n",)),                              # replaced
    ({"data": JSONL}, ()),                                                         # jsonl: none by default
    ({"data": {**JSONL, "chat_template": True}}, CHAT_CODE_STOP),
    ({"data": JSONL, "generation": {"stop": ["\n#"]}}, ("\n#",)),
])
def test_stop_default_depends_on_the_data_source_and_mode(mapping, stop):
    assert load_config_dict(mapping).generation.stop == stop


@pytest.mark.parametrize("data,chat", [({}, True), ({"source": "humaneval"}, True), (CLASSEVAL, True),
                                       (JSONL, False), ({**JSONL, "chat_template": True}, True),
                                       ({"chat_template": False}, False)])
def test_chat_mode_is_the_default_for_the_code_sources(data, chat):
    assert load_config_dict({"data": data}).data.chat_template is chat
    assert load_config_dict({}, [f"data.{k}={v}" for k, v in data.items()]).data.chat_template is chat


def test_set_chat_template_false_gives_the_raw_code_stop_strings():
    """The default job leaves `stop` out, so switching the mode from the command line switches the stop too."""
    assert load_config(DEFAULT_JOB, ["data.chat_template=false"]).generation.stop == CODE_COMPLETION_STOP


def test_set_can_clear_the_default_stop_strings():
    assert load_config(DEFAULT_JOB, ["generation.stop=[]"]).generation.stop == ()
    assert load_config_dict({}, ["generation.stop=[]"]).generation.stop == ()


@pytest.mark.parametrize("value,enabled", [(True, True), (False, False), ({"enabled": True}, True), (None, False)])
def test_baseline_shorthand(value, enabled):
    cfg = load_config_dict({"baseline": value})
    assert cfg.baseline.enabled is enabled
    assert cfg.to_dict()["baseline"] == {"enabled": enabled}


def test_set_baseline_shorthand_and_key():
    assert load_config_dict({}, ["baseline=true"]).baseline.enabled is True
    assert load_config_dict({"baseline": True}, ["baseline.enabled=false"]).baseline.enabled is False
    with pytest.raises(ConfigError) as err:
        load_config_dict({}, ["baseline=3"])
    assert err.value.problems == ["baseline: 3 must be true, false or a mapping of keys"]


def test_new_keys_round_trip():
    cfg = load_config_dict({"generation": {"method": "autoregressive"}, "data": {"chat_template": True},
                            "output": {"evaluate": True, "evaluate_timeout_s": 3}, "baseline": True})
    assert cfg.generation.method == "autoregressive" and cfg.data.chat_template is True
    assert cfg.output.evaluate is True and cfg.output.evaluate_timeout_s == 3.0 and cfg.baseline.enabled
    assert load_config_dict(cfg.to_dict()) == cfg


def test_differences_ignore_the_keys_that_do_not_change_results():
    base = load_config_dict({})
    same = load_config_dict({"output": {"dir": "elsewhere", "evaluate": True, "evaluate_timeout_s": 1},
                             "distributed": {"backend": "gloo", "timeout_s": 5}, "data": {"offset": 3, "limit": 2}})
    assert differences(base, same) == []
    other = load_config_dict({"lookahead": {"window": 7}, "baseline": True, "generation": {"stop": []}})
    changed = differences(base, other)
    # the baseline also takes batch_size's default to 1 (it times one prompt at a time)
    assert [line.split(":", 1)[0] for line in changed] == ["lookahead.window", "generation.stop",
                                                           "generation.batch_size", "baseline.enabled"]
    chat = load_config_dict({"data": {"instruction": "Fix: {prompt}", "response_prefix": "```py"}})
    assert [line.split(":", 1)[0] for line in differences(base, chat)] == ["data.instruction", "data.response_prefix"]
    assert "lookahead.window: 0 -> 7" in changed
    # the raw mode reads neither: with chat_template false in both configs they change no record
    raw = {"source": "jsonl", "path": "p.jsonl", "chat_template": False}
    raw_base, raw_other = (load_config_dict({"data": {**raw, **more}}) for more in
                           ({}, {"instruction": "Fix: {prompt}", "response_prefix": ""}))
    assert differences(raw_base, raw_other) == []
    assert "data.response_prefix" in [line.split(":", 1)[0] for line in differences(raw_base, load_config_dict(
        {"data": {**raw, "chat_template": True, "response_prefix": ""}}))]


def test_round_trip_keeps_every_value(tmp_path):
    mapping = {
        "model": {"name": "tiny-random-llama?vocab=64&seed=0", "dtype": "float64", "device": "cuda:1"},
        "lookahead": {"window": 3, "ngram": 3, "guesses": 0, "pool_seeding": False},
        "generation": {"max_new_tokens": 1, "stop": ["\n\n", "```"], "method": "autoregressive", "typical_p": 0.5,
                       "eta_cutoff": 0.001, "suppress_tokens": [3, 7], "bad_words_ids": [[1, 2]],
                       "sequence_bias": [[[1, 2], -1.5], [[4], 2.0]]},
        "data": {"source": "jsonl", "path": "p.jsonl", "offset": 4, "limit": None, "chat_template": True,
                 "instruction": "Q: {prompt}\nA:", "response_prefix": ""},
        "output": {"dir": "runs/x", "evaluate": False, "evaluate_timeout_s": 2.5},
        "distributed": {"backend": "gloo", "timeout_s": 12.5},
        "baseline": {"enabled": True},
    }
    cfg = load_config(write(tmp_path, mapping))
    resolved = cfg.to_dict()
    for section, values in mapping.items():  # every given value survives (sections may hold more keys)
        assert {k: resolved[section][k] for k in values} == values
    assert cfg.generation.stop == ("\n\n", "```")  # the engine's type
    assert yaml.safe_load(cfg.to_yaml()) == resolved


def test_missing_sections_and_keys_take_defaults(tmp_path):
    cfg = load_config(write(tmp_path, {"lookahead": {"window": 7}}))
    assert cfg.lookahead.window == 7 and cfg.lookahead.ngram == JOB_LOOKAHEAD["ngram"]
    assert cfg.model == JobConfig().model
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert load_config(empty) == JobConfig()
    assert load_config(write(tmp_path, {"model": None})) == JobConfig()


@pytest.mark.parametrize("raw,batch", [
    ({}, JOB_BATCH_SIZE),                                          # a lookahead job: batched
    ({"baseline": True}, 1),                                       # the in-run baseline times one prompt at a time
    ({"generation": {"method": "autoregressive"}}, 1),             # so does transformers generate
    ({"generation": {"max_new_tokens": 8}}, JOB_BATCH_SIZE),       # a generation section without the key
    ({"generation": {"batch_size": 1}}, 1),
    ({"generation": {"batch_size": 3}}, 3),
])
def test_batch_size_left_out_follows_the_method_and_the_baseline(raw, batch):
    assert JOB_BATCH_SIZE > 1
    assert load_config_dict(raw).generation.batch_size == batch


def test_the_default_job_is_batched_unless_the_baseline_is_on():
    assert load_config(DEFAULT_JOB).generation.batch_size == JOB_BATCH_SIZE
    assert load_config(DEFAULT_JOB, ["baseline=true"]).generation.batch_size == 1
    assert load_config(DEFAULT_JOB, ["generation.batch_size=1"]).generation.batch_size == 1


def test_set_overrides():
    cfg = load_config(DEFAULT_JOB, [
        "lookahead.window=7",
        "lookahead.pool_seeding=false",
        'generation.stop=["\\n\\n", "def "]',  # YAML double quotes read escapes
        "data.limit=null",
        "data.offset=3",
        "model.name=tiny-random-llama?vocab=64&seed=0",
        "output.dir=runs/a=b",  # only the first '=' separates
    ])
    assert cfg.lookahead.window == 7 and cfg.lookahead.pool_seeding is False
    assert cfg.generation.stop == ("\n\n", "def ")
    assert cfg.data.limit is None and cfg.data.offset == 3
    assert cfg.model.name == "tiny-random-llama?vocab=64&seed=0"
    assert cfg.output.dir == "runs/a=b"


def test_set_later_wins_and_can_fix_a_bad_file(tmp_path):
    path = write(tmp_path, {"lookahead": {"window": -1}, "data": {"source": "jsonl"}})
    cfg = load_config(path, ["lookahead.window=2", "lookahead.window=4", "data.path=p.jsonl"])
    assert cfg.lookahead.window == 4 and cfg.data.path == "p.jsonl"


def test_lookahead_keys_left_out_take_the_job_defaults(tmp_path):
    """A partial lookahead section keeps the job's defaults for the other keys, not the engine's."""
    cfg = load_config(write(tmp_path, {"lookahead": {"window": 15, "ngram": 5}}))
    assert (cfg.lookahead.window, cfg.lookahead.ngram) == (15, 5)
    assert cfg.lookahead.guesses == JOB_LOOKAHEAD["guesses"]
    assert cfg.lookahead.suffix_factor == JOB_LOOKAHEAD["suffix_factor"] > 0 and cfg.lookahead.job_cache
    off = load_config(write(tmp_path, {"lookahead": {"job_cache": False}}))
    assert not off.lookahead.job_cache and off.lookahead.suffix_tokens == JOB_LOOKAHEAD["suffix_tokens"]


def test_set_adds_a_missing_section(tmp_path):
    cfg = load_config(write(tmp_path, {}), ["generation.max_new_tokens=8"])
    assert cfg.generation.max_new_tokens == 8


def test_set_problems_are_collected_with_file_problems(tmp_path):
    path = write(tmp_path, {"lookahead": {"ngram": 1}})
    with pytest.raises(ConfigError) as err:
        load_config(path, ["lookahead.window=-1", "oops"])
    keys = {line.split(":", 1)[0] for line in err.value.problems}
    assert keys == {"lookahead.ngram", "lookahead.window", "--set 'oops'"}


def test_a_set_without_its_section_names_the_section(tmp_path):
    """--set lp_size=2 (the sweep grid's shorthand) said only 'expected section.key=value'."""
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {}), ["lp_size=2", "foo=1"])
    assert err.value.problems == [
        "--set 'lp_size=2': expected section.key=value (e.g. lookahead.window=7); lp_size belongs in distributed: "
        "--set distributed.lp_size=2",
        "--set 'foo=1': expected section.key=value (e.g. lookahead.window=7)"]


def test_problem_lines_name_value_and_allowed_values(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, {"model": {"dtype": "half"}, "data": {"source": "csv"}}))
    text = str(err.value)
    assert "model.dtype: 'half' must be one of float32, bfloat16, float16, float64" in text
    assert "data.source: 'csv' must be one of humaneval, classeval, jsonl" in text
    assert textwrap.dedent(text).startswith("invalid config ")


def test_readme_config_block_is_the_default_job():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    block = doc.split("## Job configs", 1)[1].split("```yaml\n", 1)[1].split("\n```", 1)[0]  # the fence line
    assert load_config_dict(read_yaml(block)) == JobConfig() == load_config(DEFAULT_JOB)


@pytest.mark.parametrize("mapping,world,cuda,key", [
    ({"distributed": {"backend": "nccl"}}, 1, False, "distributed.backend:"),
    ({"model": {"device": "cuda:1"}}, 2, True, "model.device:"),
    ({"model": {"device": "cuda"}}, 1, False, "model.device:"),
    ({"model": {"compile": "reduce-overhead"}}, 1, False, "model.compile:"),
])
def test_where_the_job_runs_is_checked(mapping, world, cuda, key):
    from lp.jobs.config import environment_problems

    cfg = load_config_dict(mapping)
    problems = environment_problems(cfg, world, cuda)
    assert len(problems) == 1 and problems[0].startswith(key)
    assert environment_problems(load_config_dict({}), world, cuda) == []
    assert environment_problems(load_config_dict({"model": {"device": "cuda:1"}}), 1, True) == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_nccl_without_cuda_exits_2_naming_the_key(tmp_path):
    result = CliRunner().invoke(main, ["--config", str(write(tmp_path, {"distributed": {"backend": "nccl"}}))])
    assert result.exit_code == 2 and "distributed.backend: 'nccl' needs CUDA" in result.stderr

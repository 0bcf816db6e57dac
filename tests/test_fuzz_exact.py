"""scripts/fuzz_exact.py in the default suite: a few dozen of its random cases (each a tiny float64 model of
some family, prompts, every lookahead key, the batch size, generate's processors, a row-wise
prefix_allowed_tokens_fn and stopping criterion, lp.generate or the drop-in) decode to generate's ids (sampled ones to
generate's with the same draws); as JSONL jobs (--jobs) they write those ids, an error record for each bad
line and, resumed, the whole run's records; the cases it found wrong stay pinned;
and a wrong decode, record or resume is reported, not passed."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import fuzz_exact  # noqa: E402

# cases the fuzzer found wrong, as it drew them then: a forced EOS id that is also a one-token bad word
# (generate bans, then forces; lp forced, then banned, and emitted token 0)
FOUND = [
    dict(case=396, family="falcon", vocab=16, seed=31,
         prompts=[[6, 13, 7, 13, 13, 7, 11, 6, 8, 13, 7, 11, 15, 13, 7, 13, 7], [13, 15, 13, 7, 13, 4, 13, 7, 11],
                  [7, 13, 7, 11]],
         max_new_tokens=35, eos=[14, 7], batch_size=1,
         keys=dict(window=1, ngram=5, guesses=8, pool_seeding=True, lookup_candidates=1, lookup_tokens=10,
                   lookup_ngram=2, suffix_factor=0.0, suffix_tokens=16, suffix_min_score=0.0, job_cache=False,
                   tree_budget=0, row_budget=False, prefix_reuse=True),
         knobs=dict(bad_words_ids=[[8], [5, 7]], forced_eos_token_id=8, min_new_tokens=9)),
    dict(case=658, family="gemma2", vocab=16, seed=832,
         prompts=[[5, 4, 13, 13, 4, 13, 11, 9], [4, 13, 4, 13, 11, 9, 4, 13, 11, 9, 11, 4, 13, 4, 4, 5, 5, 13, 13]],
         max_new_tokens=21, eos=[14], batch_size=2,
         keys=dict(window=0, ngram=6, guesses=0, pool_seeding=True, lookup_candidates=0, lookup_tokens=1,
                   lookup_ngram=2, suffix_factor=0.0, suffix_tokens=32, suffix_min_score=0.0, job_cache=True,
                   tree_budget=0, row_budget=False, prefix_reuse=True),
         knobs=dict(suppress_tokens=[11, 15], bad_words_ids=[[4], [12, 10]], forced_eos_token_id=4)),
]


# case 400187 as drawn among the 32 families before gptj, opt and stablelm joined (a case's number draws
# another family from a longer list)
NEAR_TIE = dict(case=400187, family="cohere2", vocab=64, seed=850,
                prompts=[[21, 61, 54, 55], [61, 21, 61, 54, 45, 37, 33, 22, 61, 54, 45, 37, 33, 50, 7, 61, 54, 45, 61, 54,
                                            45, 37, 33, 22], [39, 61, 54, 44, 61, 54, 45]],
                max_new_tokens=37, eos=[33, 58], batch_size=4,
                keys=dict(window=0, ngram=6, guesses=0, pool_seeding=True, lookup_candidates=3, lookup_tokens=10,
                          lookup_ngram=2, suffix_factor=4.0, suffix_tokens=16, suffix_min_score=0.0, job_cache=False,
                          tree_budget=0, row_budget=False, prefix_reuse=True),
                knobs=dict(no_repeat_ngram_size=2, begin_suppress_tokens=[28, 22, 26], forced_eos_token_id=35),
                entry="drop-in", allowed=None, stop_on_repeat=False,
                sampling=dict(temperature=1.39, seed=632, typical_p=0.41, top_k=2), stop=[])


@pytest.mark.parametrize("first", range(0, 40, 10))
def test_random_cases_are_generates_ids(first):
    drafted = 0
    for case in range(first, first + 10):
        wrong, multi = fuzz_exact.run_case(fuzz_exact.draw_case(case))
        assert wrong == [], (case, wrong)
        drafted += multi
    assert drafted > 0          # the cases accept drafts: a round that commits one token proves little


@pytest.mark.parametrize("spec,entry", [(FOUND[0], "generate"), (FOUND[0], "drop-in"), (FOUND[1], "generate")],
                         ids=["396", "396-drop-in", "658"])     # (generate's padded Gemma 2 rows are NaN)
def test_cases_once_found_wrong(spec, entry):
    assert fuzz_exact.run_case(dict(spec, entry=entry, allowed=None, stop_on_repeat=False))[0] == []


def test_the_draws_cover_every_entry_and_knob():
    specs = [fuzz_exact.draw_case(c) for c in range(40)]
    assert {s["entry"] for s in specs} == {"generate", "drop-in"}
    assert any(s["allowed"] for s in specs) and any(s["stop_on_repeat"] for s in specs)
    assert any(s["sampling"] and len(s["sampling"]) > 2 for s in specs)        # warpers beside the temperature
    assert any(s["sampling"] for s in specs if s["entry"] == "drop-in")        # seeded from torch's generator
    assert any(s["stop"] for s in specs)
    assert any(s["batch_size"] > 1 and s["keys"]["row_budget"] for s in specs)
    assert len({k for s in specs for k in s["knobs"]}) >= 6
    assert fuzz_exact.draw_case(7) == fuzz_exact.draw_case(7)       # a case is replayed by its number


@pytest.mark.parametrize("entry", ["generate", "drop-in"])
def test_a_wrong_decode_is_reported(entry, monkeypatch):
    """lp with its last token changed: the fuzzer names the prompt and the position."""
    spec = next(s for s in map(fuzz_exact.draw_case, range(100))
                if s["entry"] == entry and s["max_new_tokens"] > 3 and not s["stop_on_repeat"])
    real = fuzz_exact.decode

    def off_by_one(model, spec):
        got, multi, results = real(model, spec)
        return [ids[:-1] + [(ids[-1] + 1) % spec["vocab"]] for ids in got], multi, results
    monkeypatch.setattr(fuzz_exact, "decode", off_by_one)
    wrong, _ = fuzz_exact.run_case(spec)
    assert [w["prompt"] for w in wrong] == list(range(len(spec["prompts"])))
    assert all(w["at"] == len(w["want"]) - 1 for w in wrong) and fuzz_exact.failures(wrong) == wrong
    assert fuzz_exact.main(["--case", str(spec["case"])]) == 1


@pytest.mark.parametrize("entry", ["generate", "drop-in", "job"])
def test_a_sampled_case_is_checked_against_its_own_draws(entry, monkeypatch):
    """Sampled ids equal generate's with lp's draws (lp.generate: of the prompt's index; the drop-in: seeded
    from torch's generator; a job: of the task id), and not with the next seed's: the check bites."""
    draw, check = (fuzz_exact.job_case, fuzz_exact.run_job) if entry == "job" else \
        (fuzz_exact.draw_case, fuzz_exact.run_case)
    spec = next(s for s in map(draw, range(200)) if s["entry"] == entry and s["sampling"]
                and s["max_new_tokens"] > 5 and not s["stop"] and not s["stop_on_repeat"])
    assert check(spec)[0] == []
    real = fuzz_exact.lp_draws

    def next_seed(spec, requests):
        return real(dict(spec, sampling=dict(spec["sampling"], seed=spec["sampling"]["seed"] + 1)), requests)
    monkeypatch.setattr(fuzz_exact, "lp_draws", next_seed)
    assert check(spec)[0] != []


def test_a_float32_near_tie_is_reported_apart(capsys, monkeypatch):
    """generate casts a float64 model's scores to float32 before its processors and warpers; lp keeps them
    float64. In case 400187 (NEAR_TIE: typical_p over two nearly equal tokens) the cast swaps typical
    sampling's sort keys, so generate keeps the other token: lp's ids are generate's in float64, and the fuzzer says so
    instead of failing."""
    spec = NEAR_TIE
    model = fuzz_exact.model_of(spec)
    wanted, in_float64 = fuzz_exact.oracle(model, spec), fuzz_exact.oracle(model, spec, float64=True)
    assert wanted != in_float64         # the oracles differ: only the cast
    wrong, _ = fuzz_exact.run_case(spec)
    assert wrong and all(w["float32_tie"] for w in wrong) and fuzz_exact.failures(wrong) == []
    assert [fuzz_exact.decode(model, spec)[0][w["prompt"]] for w in wrong] == [in_float64[w["prompt"]] for w in wrong]
    drawn = fuzz_exact.draw_case
    monkeypatch.setattr(fuzz_exact, "draw_case", lambda case: NEAR_TIE if case == 400187 else drawn(case))
    assert fuzz_exact.main(["--case", "400187"]) == 0
    assert "0 failed, 1 with only float32 near-ties" in capsys.readouterr().out
    ids = torch.tensor([spec["prompts"][0]])
    with fuzz_exact.generate_in_float64(model):
        scores = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, pad_token_id=0,
                                output_scores=True, return_dict_in_generate=True).scores
    assert [s.dtype for s in scores] == [torch.float64] * 2


def test_a_missing_output_is_reported(monkeypatch):
    """lp.generate returning one result fewer than its prompts: reported, though every pair it has holds."""
    spec = next(s for s in map(fuzz_exact.draw_case, range(100)) if s["entry"] == "generate" and len(s["prompts"]) > 1)
    real = fuzz_exact.decode

    def one_short(model, spec):
        got, multi, results = real(model, spec)
        return got[:-1], multi, results[:-1]
    monkeypatch.setattr(fuzz_exact, "decode", one_short)
    wrong, _ = fuzz_exact.run_case(spec)
    assert wrong == [dict(error=f"{len(spec['prompts']) - 1} outputs for {len(spec['prompts'])} prompts")]


def test_a_wrong_finish_reason_is_reported(monkeypatch):
    """lp.generate's results with every finish reason swapped for another: each prompt is named."""
    spec = next(s for s in map(fuzz_exact.draw_case, range(100)) if s["entry"] == "generate")
    real = fuzz_exact.decode

    def swapped(model, spec):
        got, multi, results = real(model, spec)
        for r in results:
            r.finish_reason = {"eos": "length"}.get(r.finish_reason, "eos")
        return got, multi, results
    monkeypatch.setattr(fuzz_exact, "decode", swapped)
    wrong, _ = fuzz_exact.run_case(spec)
    assert [w["prompt"] for w in wrong] == list(range(len(spec["prompts"])))
    assert all("finish_reason" in w for w in wrong)


def test_a_wrong_text_is_reported(monkeypatch):
    """With stop strings, lp.generate's text is the decoded output cut before the first one: a result
    whose text keeps one more character is named."""
    spec = next(s for s in map(fuzz_exact.draw_case, range(200)) if s["stop"])
    real = fuzz_exact.decode

    def longer(model, spec):
        got, multi, results = real(model, spec)
        for r in results:
            r.text += "x"
        return got, multi, results
    monkeypatch.setattr(fuzz_exact, "decode", longer)
    wrong, _ = fuzz_exact.run_case(spec)
    assert [w["prompt"] for w in wrong] == list(range(len(spec["prompts"]))) and all("text" in w for w in wrong)


@pytest.mark.parametrize("nproc,lp_size", [(2, None), (4, 2)])
def test_random_cases_under_lp_are_generates_ids(nproc, lp_size):
    """Under torchrun (gloo) the same cases decode with LP, over the world or in dp x lp groups: every
    rank's ids are generate's."""
    import os
    import re
    import subprocess

    root = Path(__file__).resolve().parents[1]
    more = ["--lp-size", str(lp_size)] if lp_size else []
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                           str(root / "scripts" / "fuzz_exact.py"), "--first", "40", "--cases", "8", *more],
                          env=dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ends = re.findall(r"rank (\d+): world (\d+), (\d+) group\(s\), (\d+) collectives, 8 cases \(.*?\), (\d+) failed",
                      proc.stdout)
    assert sorted(int(e[0]) for e in ends) == list(range(nproc)), proc.stdout
    for rank, world, groups, collectives, failed in ends:
        assert (int(world), int(groups)) == (lp_size or nproc, nproc // (lp_size or nproc)), proc.stdout
        assert int(collectives) > 0 and failed == "0", proc.stdout


# ---- --jobs: the same draws as JSONL jobs (lp.run in this process) -----------------------------------------

def test_random_job_cases_hold():
    """Jobs: every selected line has one record, a prompt's has generate's ids (sampled: with the task's
    draws), finish reason and text, a bad line has an error record, and a resumed job
    keeps every record."""
    drafted = 0
    for case in range(40):
        wrong, multi = fuzz_exact.run_job(fuzz_exact.job_case(case))
        assert wrong == [], (case, wrong)
        drafted += multi
    assert drafted > 0


def test_a_job_case_once_found_wrong():
    """Job 407: a sampled job (temperature 1.45, top_k 0) with the in-run baseline, whose generate drew
    from its top-50 (an unset top_k), where lookahead and the job's config draw from all 64 tokens."""
    assert fuzz_exact.run_job(fuzz_exact.job_case(407))[0] == []


def test_the_job_draws_cover_methods_bad_lines_and_resumes():
    specs = [fuzz_exact.job_case(c) for c in range(40)]
    assert {s["entry"] for s in specs} == {"job"} and not any(s["allowed"] or s["stop_on_repeat"] for s in specs)
    assert {s["method"] for s in specs} == {"lookahead", "autoregressive"} and any(s["baseline"] for s in specs)
    assert any(s["sampling"] for s in specs) and any(s["stop"] for s in specs)
    assert any(s["sampling"] and s["baseline"] for s in specs)      # checked against generate's own draws
    assert any(s["batch_size"] > 1 for s in specs) and len({k for s in specs for k in s["knobs"]}) >= 6
    assert {bool(s["resume"]["torn"]) for s in specs if s["resume"]} == {True, False}
    assert any(line.get("broken") for s in specs for line in s["lines"])
    assert any(line.get("prompt") == "" for s in specs for line in s["lines"])
    assert any(s["offset"] for s in specs) and any(s["limit"] is not None for s in specs)
    assert fuzz_exact.job_case(7) == fuzz_exact.job_case(7)
    # draw_case's cases are unchanged by the jobs' draws (pinned cases and past runs replay as they were)
    assert all(fuzz_exact.job_case(c)["prompts"] == fuzz_exact.draw_case(c)["prompts"] for c in range(40))


def test_a_wrong_job_record_is_reported(monkeypatch):
    """A job whose records carry a changed last token: the fuzzer names each task."""
    import lp.jobs.runner
    spec = next(s for s in map(fuzz_exact.job_case, range(100)) if s["max_new_tokens"] > 3
                and not any(line.get("broken") or line.get("prompt") == "" for line in s["lines"]))
    real = lp.jobs.runner.result_record

    def off_by_one(*args, **kwargs):
        record = real(*args, **kwargs)
        record["token_ids"][-1] = (record["token_ids"][-1] + 1) % spec["vocab"]
        return record
    monkeypatch.setattr(lp.jobs.runner, "result_record", off_by_one)
    wrong, _ = fuzz_exact.run_job(spec)
    assert sorted(w["task"] for w in wrong) == sorted(line["task_id"] for line in fuzz_exact.selected(spec))
    assert all(w["at"] == len(w["want"]) - 1 for w in wrong)


def test_a_resume_that_decodes_kept_tasks_again_is_reported(monkeypatch):
    """A resume that forgets the records it finds writes a second record for them: reported."""
    import lp.jobs.results
    spec = next(s for s in map(fuzz_exact.job_case, range(200)) if s["resume"] and s["resume"]["keep"] > 0)
    assert fuzz_exact.run_job(spec)[0] == []
    real = lp.jobs.results.JobDir._read_records
    runs = []

    def forgetful(self, *args, **kwargs):
        records = real(self, *args, **kwargs)
        runs.append(len(records))
        return {} if records else records
    monkeypatch.setattr(lp.jobs.results.JobDir, "_read_records", forgetful)
    wrong, _ = fuzz_exact.run_job(spec)
    assert [w["task"] for w in wrong] == ["resume"] and wrong[0]["kept"] == spec["resume"]["keep"]
    assert len(wrong[0]["got"]) > len(wrong[0]["want"])         # the kept tasks twice


def test_jobs_are_refused_under_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit:
        fuzz_exact.main(["--jobs", "--cases", "1"])
    assert exit.value.code == 2 and "--jobs runs in one process" in capsys.readouterr().err


def test_an_lp_size_torchrun_cannot_give_is_refused(capsys, monkeypatch):
    """--lp-size was not checked: under torchrun a size that does not divide the world gave a traceback on
    every rank, and in one process it was ignored."""
    for world, size in (("1", "2"), ("3", "2"), ("2", "0")):
        monkeypatch.setenv("WORLD_SIZE", world)
        with pytest.raises(SystemExit) as e:
            fuzz_exact.main(["--lp-size", size, "--cases", "1"])
        assert e.value.code == 2
        assert f"--lp-size: distributed.lp_size: {size} must be >= 1 and divide the world size {world}" in \
            capsys.readouterr().err

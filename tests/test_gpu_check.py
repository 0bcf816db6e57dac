"""The device check (scripts/gpu_check.sh) with --small on the CPU: every stage of the GPU run in
miniature (saved models and tokenizer, in-process eager decoding, the torchrun jobs with gloo, the
compiled job and the compiled worker), its JSON's structure and the values a CPU run can check.
Plus its time guard and its sync counting, which a CPU run never triggers, as units."""
import importlib.util
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["setup", "eager/tiny-llama", "eager/tiny-smol", "job/tiny-llama", "job/tiny-smol",
          "job-batched/tiny-llama", "job-batched/tiny-smol", "job-compiled/tiny-smol", "compiled/tiny-smol"]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    out = tmp / "check.json"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--small", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "job (torchrun, world 1, gloo" in proc.stdout       # the printed summary
    return json.loads(out.read_text())


def test_every_stage_ran(report):
    assert list(report["stages"]) == STAGES
    assert {k: v["status"] for k, v in report["stages"].items()} == {k: "ok" for k in STAGES}
    assert report["device"] == "cpu" and report["backend"] == "gloo" and report["compile_mode"] == "default"
    assert "not applicable" in report["host_syncs"]
    assert report["seconds"] < report["budget_s"]
    gpu = yaml.safe_load((ROOT / "configs" / "codellama-7b-humaneval.yaml").read_text())["lookahead"]
    assert {k: report["lookahead"][k] for k in gpu} == gpu   # the shipped GPU setting
    assert {m: v["dtype"] for m, v in report["models"].items()} == {"tiny-llama": "float16", "tiny-smol": "float32"}


def test_eager_stage(report):
    new, k = report["workload"]["new_tokens"], report["workload"]["inprocess_prompts"]
    for model in report["models"]:
        stage = report["stages"][f"eager/{model}"]
        assert [p["rows"] for p in stage["forward_curve"]] == [1, 2, 4, 8, 16]
        assert all(p["seconds"] > 0 for p in stage["forward_curve"])
        gen, look = stage["systems"]["generate eager"], stage["systems"]["lookahead eager"]
        assert gen["tokens"] == look["tokens"] == k * new and gen["forwards"] == k * new
        assert look["world_size"] == 1 and look["backend"] == "gloo" and look["collectives_per_round"] == 2
        assert 0 < look["forward_device_ms"] <= look["device_ms_per_round"] and look["wall_ms_per_round"] > 0
        assert gen["device_ms_per_forward"] > 0 and look["rounds"] <= look["tokens"]
        assert gen["host_syncs"] is None and look["host_syncs_per_round"] is None   # CPU: not applicable
    smol = report["stages"]["eager/tiny-smol"]["systems"]          # float32: exact
    assert smol["lookahead eager"]["token_ids"] == smol["generate eager"]["token_ids"]
    assert smol["lookahead eager"]["ids_equal_generate"] == f"{k}/{k}"


def test_torchrun_jobs(report):
    w = report["workload"]
    runs = (("job/tiny-llama", w["prompts"], "off"), ("job/tiny-smol", w["prompts"], "off"),
            ("job-compiled/tiny-smol", w["compiled_job_prompts"], "default"))
    for stage, prompts, compile_mode in runs:
        job = report["stages"][stage]
        assert job["returncode"] == 0
        assert "-m torch.distributed.run --standalone --nproc-per-node 1 -m lp.run --config" in job["command"]
        s = job["summary"]
        assert (s["world_size"], s["backend"], s["collectives_per_round"]) == (1, "gloo", 2)
        assert s["prompts"] == prompts and s["errors"] == 0 and s["new_tokens"] == prompts * w["new_tokens"]
        assert s["baseline_prompts"] == prompts and s["finish_reasons"] == {"length": prompts}
        assert job["config"]["model"]["compile"] == compile_mode and job["config"]["baseline"]["enabled"]
    assert report["stages"]["job/tiny-llama"]["config"]["lookahead"] == report["lookahead"]
    assert report["stages"]["job-compiled/tiny-smol"]["config"]["lookahead"] == report["compiled_lookahead"]
    smol, compiled = report["stages"]["job/tiny-smol"], report["stages"]["job-compiled/tiny-smol"]
    # float32: the job's ids equal its in-run baseline, and the in-process decodes of the same prompts
    assert smol["summary"]["baseline_ids_equal_fraction"] == 1.0 and smol["ids_equal_baseline"] == "3/3"
    assert smol["ids_equal_inprocess_lookahead"] == smol["ids_equal_inprocess_generate"] == "2/2"
    assert compiled["summary"]["baseline_ids_equal_fraction"] == 1.0
    assert compiled["token_ids"][0] == report["stages"]["eager/tiny-smol"]["systems"]["generate eager"]["token_ids"][0]


def test_batched_job_stage(report):
    """Every prompt in one batch through the job path: the batch-1 job's ids in float32, rounds packed."""
    w = report["workload"]
    for model in report["models"]:
        job = report["stages"][f"job-batched/{model}"]
        s = job["summary"]
        assert job["config"]["generation"]["batch_size"] == w["prompts"] and not job["config"]["baseline"]["enabled"]
        assert s["prompts"] == w["prompts"] and s["errors"] == 0 and s["mean_batch"] > 1
    assert report["stages"]["job-batched/tiny-smol"]["ids_equal_batch_one_job"] == f"{w['prompts']}/{w['prompts']}"


def test_compiled_stage(report):
    stage = report["stages"]["compiled/tiny-smol"]
    assert stage["compile_mode"] == "default"
    look, loop = stage["systems"]["lookahead compiled"], stage["systems"]["greedy loop compiled"]
    assert look["lookahead"] == report["compiled_lookahead"] and look["collectives_per_round"] == 2
    assert loop["lookahead"]["window"] == 0 and loop["lookahead"]["guesses"] == 0 and loop["collectives_per_round"] == 0
    eager = report["stages"]["eager/tiny-smol"]["systems"]
    # greedy lookahead eager == compiled == autoregressive, and the compiled greedy loop too
    assert look["token_ids"] == loop["token_ids"] == eager["generate eager"]["token_ids"][:1] \
        == eager["lookahead eager"]["token_ids"][:1]
    assert look["ids_equal_generate"] == loop["ids_equal_lookahead_eager"] == "1/1"
    assert look["warmup_seconds"] > 0 and look["device_ms_per_round"] > 0
    assert look["tokens"] == loop["tokens"] == report["workload"]["new_tokens"]


def test_time_guard_skips_and_stops(tmp_path):
    gcheck = _module()
    check = gcheck.Check(tmp_path / "r.json", budget_s=5, report={})
    assert check.stage("fits", 1, lambda left: {"left": left})["status"] == "ok"
    skipped = check.stage("too big", 60, lambda left: pytest.fail("must not run"))
    assert skipped["status"] == "skipped" and "needs about 60 s" in skipped["reason"]
    needs = check.stage("after", 0, lambda left: pytest.fail("must not run"), needs=["too big"])
    assert needs["status"] == "skipped" and "too big did not succeed" in needs["reason"]
    failed = check.stage("fails", 0, lambda left: 1 / 0)
    assert failed["status"] == "failed" and "ZeroDivisionError" in failed["reason"]
    # a child that starts a worker in a session of its own, as torchrun does: both are stopped
    spawn = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
             "time.sleep(60)'], start_new_session=True); print(p.pid, flush=True); time.sleep(60)")
    t = time.perf_counter()
    stopped = check.stage("slow child", 0, lambda left: gcheck.run_child(
        [sys.executable, "-c", spawn], tmp_path / "log", min(left, 2)))
    assert stopped["status"] == "timeout" and time.perf_counter() - t < 30
    assert json.loads((tmp_path / "r.json").read_text())["stages"]["slow child"]["status"] == "timeout"
    worker = int((tmp_path / "log").read_text().split()[0])
    assert not gcheck._alive(worker)


def test_watchdog_ends_a_stage_stuck_in_process(tmp_path):
    out = tmp_path / "r.json"
    code = (f"import sys, time; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'scripts')!r}]; import gpu_check as g; "
            f"c = g.Check(g.Path({str(out)!r}), 1, {{}}); c.watchdog(2); "
            f"c.stage('stuck', 0, lambda left: time.sleep(60))")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and time.perf_counter() - t < 40, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["stages"]["stuck"]["status"] == "timeout" and "stopped at 2 s" in report["stopped"]


def test_sync_warnings_are_counted():
    gcheck = _module()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("something else")
    out = {}
    gcheck.count_sync_warnings(caught, out)
    assert out["host_syncs"] == 3 and sum(out["host_sync_sites"].values()) == 3

"""The device check (scripts/gpu_check.sh) with --small on the CPU: its preflight and every kind
of stage of the GPU run in miniature (saved models and tokenizer, the compiled worker with
transformers' static-cache generate, in-process eager, float32 exactness and profiling, the torchrun
jobs with gloo, LP with 2 ranks on one device, the batched and the compiled job), its JSON's
structure and the values a CPU run can check. Plus, as units: its time guard, the preflight's
failure, the cache lengths of both plans, the first-difference report, TF32 off and sync counting,
which a CPU run never triggers."""
import importlib.util
import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from lp.processes import alive

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["setup", "compiled/tiny-smol", "eager/tiny-llama", "eager/tiny-smol", "job/tiny-smol", "exact/tiny-llama",
          "exact/tiny-smol", "profile/tiny-llama", "lp-p2/tiny-smol", "job-batched/tiny-smol", "job-compiled/tiny-smol"]


def _module():
    if str(ROOT / "scripts") not in sys.path:
        sys.path.append(str(ROOT / "scripts"))     # its bench_util, as running the script finds it
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    out = tmp / "check.json"
    t = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--small", "--device", "cpu",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the smoke's target is 2 minutes (it prints its own time: 107 s alone on the 2-core CPU today); the
    # suite guards against it growing, with room for a loaded CI machine (182 s inside a full run there,
    # 274 s beside other test runs)
    assert time.perf_counter() - t < 420, "the smoke run must stay near 2 minutes"
    assert "job (torchrun, world 1, gloo" in proc.stdout and "lp-p2 (torchrun, world 2, gloo" in proc.stdout
    return json.loads(out.read_text())


def test_every_stage_ran(report):
    assert list(report["stages"]) == STAGES and report["plan"] == STAGES[1:]
    assert {k: v["status"] for k, v in report["stages"].items()} == {k: "ok" for k in STAGES}
    assert report["backend"] == "gloo" and report["compile_mode"] == "default"
    assert "not applicable" in report["host_syncs"]
    assert report["seconds"] < report["budget_s"] and report["hard_stop_s"] <= 480   # 8 minutes
    gpu = yaml.safe_load((ROOT / "configs" / "codellama-7b-humaneval.yaml").read_text())["lookahead"]
    assert {k: report["lookahead"][k] for k in gpu} == gpu   # the shipped GPU setting
    assert {m: v["dtype"] for m, v in report["models"].items()} == {"tiny-llama": "float16", "tiny-smol": "float32"}
    for name, stage in report["stages"].items():     # every stage says what it was allowed and took
        assert stage["estimate_basis"] and stage["seconds"] > 0 and stage["seconds"] <= stage["allowed_s"], name


def test_preflight(report):
    pre = report["preflight"]
    assert pre["ok"] and pre["device"] == "cpu" and pre["torch"] == torch.__version__ and pre["cuda"] is None
    assert pre["cache"] == {"layers": 2, "slots": 256, "key_shape": [1, 2, 256, 16], "dtype": "torch.float32",
                            "device": "cpu"}
    eager, compiled = pre["lookahead off"], pre["lookahead default"]
    assert len(eager["token_ids"]) == 4 and eager["rounds"] >= 1 and pre["ids_equal"]
    assert compiled["token_ids"] == eager["token_ids"] and compiled["seconds"] > eager["seconds"]   # it compiled
    # the batched rounds of a row budget's grid: 1 request x 1, 2, 8 rows and 4 requests x 1, 2, 8
    assert pre["batched probe"]["cells"] == 6 and pre["batched probe"]["dtype"] == "torch.float32"
    assert pre["seconds"] < 60


def test_compiled_stage(report):
    stage = report["stages"]["compiled/tiny-smol"]
    assert stage["compile_mode"] == "default"
    systems = stage["systems"]
    look, loop = systems["lookahead compiled"], systems["greedy loop compiled"]
    static = systems["transformers static generate compiled"]
    assert look["lookahead"] == report["compiled_lookahead"] and look["collectives_per_round"] == 0
    assert loop["lookahead"]["window"] == 0 and loop["lookahead"]["guesses"] == 0 and loop["collectives_per_round"] == 0
    # one cache length for all three, as compiled_cache_slots says
    assert look["cache_slots"] == loop["cache_slots"] == static["max_cache_len"] == 256
    assert report["compiled_cache_slots"] == {"lookahead compiled": 256, "greedy loop compiled": 256}
    # float32: compiled lookahead, the compiled greedy loop and transformers' compiled generate agree
    assert look["token_ids"] == loop["token_ids"] == static["token_ids"]
    assert look["ids_equal_greedy_loop"] == static["ids_equal_greedy_loop"] == "1/1"
    new = report["workload"]["compiled_tokens"][1]
    assert look["tokens"] == loop["tokens"] == static["tokens"] == new
    assert look["compile_seconds"] > 0 and static["compile_seconds"] > 0 and static["ms_per_token"] > 0
    for fig in (look, loop):
        p = fig["profile"]
        assert p["kernels_per_round"] > 1 and 0 < p["kernel_ms_per_round"] and 0 < p["kernel_busy"] < 1.5
    # its compile time per layer budgets the compiled job
    layers = report["models"]["tiny-smol"]["shape"]["num_hidden_layers"]
    assert report["compile_model"] == "tiny-smol"
    assert report["compile_seconds_per_layer"] == pytest.approx(look["compile_seconds"] / layers)
    job = report["stages"]["job-compiled/tiny-smol"]
    assert job["estimate_s"] == pytest.approx(20 + report["compile_seconds_per_layer"] * layers)
    assert "per layer" in job["estimate_basis"]


def test_estimates_come_from_what_was_measured(report):
    """Only stages whose work nothing had measured yet get their floor; the others are estimated from
    the eager stages' load and per-token seconds and the first job's measured start-up."""
    stages, floors = report["stages"], gcheck_floors()
    floored = [n for n, s in stages.items() if s["estimate_basis"].startswith("the floor")]
    assert floored == ["compiled/tiny-smol", "eager/tiny-llama", "eager/tiny-smol", "job/tiny-smol"]
    assert all(stages[n]["estimate_s"] == floors[n.split("/")[0]] for n in floored)
    start = stages["job/tiny-smol"]["start_seconds"]
    assert 0 < start < stages["job/tiny-smol"]["wall_seconds"] and report["job_start_seconds"] >= start
    eager = stages["eager/tiny-llama"]
    gen, look = (eager["systems"][k] for k in ("generate eager", "lookahead eager"))
    k, new = report["workload"]["inprocess_prompts"], report["workload"]["new_tokens"]
    work = eager["load_seconds"] + (3 * gen["seconds"] / gen["tokens"] + 4 * look["seconds"] / look["tokens"]) * k * new
    assert stages["exact/tiny-llama"]["estimate_s"] == pytest.approx(2 * work)
    assert stages["exact/tiny-llama"]["estimate_basis"].startswith("2 x (eager/tiny-llama")
    # the later torchrun stages: the longest start-up measured when they were planned and the load and
    # per-token seconds of the eager stage of that width (the basis names both; both models have 2 layers)
    prompts = report["workload"]["prompts"]
    for name, decodes, ranks in (("job-batched/tiny-smol", prompts * new, 1), ("lp-p2/tiny-smol", 2 * k * new, 2)):
        basis = stages[name]["estimate_basis"]
        found = re.search(r"(eager/[\w-]+).*start-up ([0-9.]+) s", basis)
        assert found, (name, basis)
        rates, used = stages[found[1]], float(found[2])
        assert start - 0.05 <= used <= report["job_start_seconds"] + 0.05, name
        look = rates["systems"]["lookahead eager"]
        expected = ranks * (used + rates["load_seconds"] + look["seconds"] / look["tokens"] * decodes)
        # the basis rounds the start-up to 0.1 s; the report rounds its seconds
        assert stages[name]["estimate_s"] == pytest.approx(expected, rel=0.01, abs=0.06 * ranks), name


def gcheck_floors() -> dict:
    return {**_module().SMALL.floors, "lp-p2": _module().SMALL.floors["lp"]}


def test_eager_stage(report):
    new, k = report["workload"]["new_tokens"], report["workload"]["inprocess_prompts"]
    for model in ("tiny-llama", "tiny-smol"):
        stage = report["stages"][f"eager/{model}"]
        assert [p["rows"] for p in stage["forward_curve"]] == [1, 2, 4, 8, 16]
        assert all(p["seconds"] > 0 for p in stage["forward_curve"])
        gen, look = stage["systems"]["generate eager"], stage["systems"]["lookahead eager"]
        # the first prompt warms each system up, untimed; the others are timed
        assert gen["tokens"] == look["tokens"] == (k - 1) * new and gen["forwards"] == (k - 1) * new
        assert len(gen["token_ids"]) == len(look["token_ids"]) == k          # ids: the warm-up's too
        assert stage["warm_up"]["prompts"] == 1 and stage["warm_up"]["generate_ms_per_forward"] > 0
        assert look["world_size"] == 1 and look["backend"] == "gloo" and look["collectives_per_round"] == 0
        assert 0 < look["forward_device_ms"] <= look["device_ms_per_round"] and look["wall_ms_per_round"] > 0
        assert gen["device_ms_per_forward"] > 0 and look["rounds"] <= look["tokens"]
        assert gen["host_syncs"] is None and look["host_syncs_per_round"] is None   # CPU: not applicable
        assert "device_busy" not in look     # event spans are no busy time: the profile stage measures that
    smol = report["stages"]["eager/tiny-smol"]["systems"]          # float32: exact
    assert smol["lookahead eager"]["token_ids"] == smol["generate eager"]["token_ids"]
    assert smol["lookahead eager"]["ids_equal_generate"] == f"{k}/{k}"
    assert smol["lookahead eager"]["differences_from_generate"] == []


def test_exact_stage(report):
    k, new = report["workload"]["inprocess_prompts"], report["workload"]["new_tokens"]
    for model, saved in (("tiny-llama", "float16"), ("tiny-smol", "float32")):
        stage = report["stages"][f"exact/{model}"]
        assert stage["dtype"] == "float32" and stage["saved_dtype"] == saved
        assert stage["matmul"] == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False,
                                   "float32_matmul_precision": "highest"}
        assert stage["ids_equal"] == f"{k}/{k}" and stage["differences"] == []
        assert stage["lookahead_token_ids"] == stage["generate_token_ids"]
        assert [len(ids) for ids in stage["lookahead_token_ids"]] == [new] * k and stage["rounds"] <= k * new
        # generate's processors on the same prompts: the same ids, which they changed; sampling runs its warpers
        assert stage["processors"]["ids_equal"] == f"{k}/{k}" and stage["processors"]["changed_by_them"] is True
        assert stage["processors"]["knobs"] == {k2: list(v) if isinstance(v, tuple) else v
                                                for k2, v in _module().PROCESSED.items()}
        assert stage["sampled"]["tokens"] == k * new and stage["sampled"]["S"] >= 1
        # a prefix_allowed_tokens_fn called row by row: transformers' generate's ids with it, which it changed
        row = stage["row_processor"]
        assert row["ids_equal"] == f"{k}/{k}" and row["changed_by_it"] is True and row["S"] >= 1
        assert row["host_ms_per_round"] > 0 and row["generate_ms_per_token"] > 0


def test_profile_stage(report):
    stage = report["stages"]["profile/tiny-llama"]
    assert stage["activity"] == "cpu" and stage["new_tokens"] == report["workload"]["profile_tokens"]
    look, gen = stage["systems"]["lookahead eager"], stage["systems"]["generate eager"]
    assert gen["rounds"] == stage["new_tokens"] and 1 <= look["rounds"] <= stage["new_tokens"]
    for fig in (look, gen):
        assert fig["kernels_per_round"] > 10 and fig["wall_ms_per_round"] > 0
        assert 0 < fig["kernel_ms_per_round"] and fig["kernel_busy"] == pytest.approx(
            fig["kernel_ms_per_round"] / fig["wall_ms_per_round"])
    assert look["kernels_per_round"] > gen["kernels_per_round"]     # a round does more than a forward


def test_lp_on_one_device(report):
    """P = 2 (the GPU plan: 2 and 4), every rank on the one device with gloo: the tokens of P = 1 (exact/,
    float32)."""
    k = report["workload"]["inprocess_prompts"]
    exact = report["stages"]["exact/tiny-smol"]
    for ranks in (2,):
        job = report["stages"][f"lp-p{ranks}/tiny-smol"]
        s = job["summary"]
        assert f"--nproc-per-node {ranks} -m lp.run" in job["command"] and job["env"] == {"LP_SHARED_DEVICE": "1"}
        assert (s["world_size"], s["backend"], s["prompts"], s["errors"]) == (ranks, "gloo", k, 0)
        assert job["config"]["model"]["dtype"] == "float32" and job["config"]["lookahead"] == report["lookahead"]
        assert job["token_ids"] == exact["lookahead_token_ids"] and job["ids_equal_p1"] == f"{k}/{k}"
        assert job["ids_equal_generate_float32"] == f"{k}/{k}"


def test_torchrun_jobs(report):
    w = report["workload"]
    runs = (("job/tiny-smol", w["prompts"], "off"), ("job-compiled/tiny-smol", w["compiled_job_prompts"], "default"))
    for stage, prompts, compile_mode in runs:
        job = report["stages"][stage]
        assert job["returncode"] == 0
        assert "-m torch.distributed.run --standalone --nproc-per-node 1 -m lp.run --config" in job["command"]
        s = job["summary"]
        assert (s["world_size"], s["backend"], s["collectives_per_round"]) == (1, "gloo", 0)
        assert s["prompts"] == prompts and s["errors"] == 0 and s["new_tokens"] == prompts * w["new_tokens"]
        assert s["baseline_prompts"] == prompts and s["finish_reasons"] == {"length": prompts}
        assert job["config"]["model"]["compile"] == compile_mode and job["config"]["baseline"]["enabled"]
    assert report["stages"]["job/tiny-smol"]["config"]["lookahead"] == report["lookahead"]
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
    job = report["stages"]["job-batched/tiny-smol"]
    s = job["summary"]
    assert job["config"]["generation"]["batch_size"] == w["prompts"] and not job["config"]["baseline"]["enabled"]
    assert s["prompts"] == w["prompts"] and s["errors"] == 0 and s["mean_batch"] > 1
    assert job["ids_equal_batch_one_job"] == f"{w['prompts']}/{w['prompts']}"


def test_both_plans_give_both_compiled_systems_one_cache_length():
    gcheck = _module()
    from lp.jobs.config import load_config

    gpu = __import__("dataclasses").asdict(load_config(ROOT / "configs" / "codellama-7b-humaneval.yaml").lookahead)
    assert gcheck.compiled_cache_slots(gcheck.FULL, gpu) == {"lookahead compiled": 1024, "greedy loop compiled": 1024}
    assert gcheck.compiled_cache_slots(gcheck.SMALL, gcheck.SMALL.compiled_lookahead) == {
        "lookahead compiled": 256, "greedy loop compiled": 256}
    # what the old workload gave: 1024 slots for lookahead, 512 for the greedy loop
    old = __import__("dataclasses").replace(gcheck.FULL, compiled_tokens=(96, 156))
    assert gcheck.compiled_cache_slots(old, gpu) == {"lookahead compiled": 1024, "greedy loop compiled": 512}
    assert all(kind in gcheck.FULL.floors for kind, *_ in gcheck.FULL.stages)


@pytest.mark.parametrize("args,message", [(["--out", "/nonexistent/x.json"], "cannot write a file there"),
                                          (["--budget-s", "-5"], "must be a finite number of seconds > 0"),
                                          (["--budget-s", "nan"], "must be a finite number of seconds > 0")])
def test_bad_arguments_stop_before_the_preflight(args, message):
    """An --out that cannot be written, or no budget, is refused at once: on a GPU, a run that learnt it
    at its end had spent the device's minutes for no figures."""
    from click.testing import CliRunner
    result = CliRunner().invoke(_module().main, ["--small", "--device", "cpu", *args])
    assert result.exit_code == 2 and message in result.output and "preflight" not in result.output


def test_first_differences_gives_position_and_margin():
    gcheck = _module()
    model = gcheck.build_model(gcheck.SMALL_SHAPES["tiny-smol"], torch.float32, torch.device("cpu"), tiny=True)
    prompt = gcheck.prompt_ids(0, 6, 384)
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, 6:].tolist()
    other = ref[:3] + [(ref[3] + 1) % 384] + ref[4:]
    (diff,) = gcheck.first_differences(model, [prompt, prompt], [ref, other], [ref, ref])
    with torch.no_grad():
        top = model(torch.tensor([prompt + ref[:3]])).logits[0, -1].topk(2)
    assert (diff["prompt"], diff["position"], diff["reference_token"], diff["token"]) == (1, 3, ref[3], other[3])
    assert diff["reference_top2"][0] == ref[3] and diff["reference_top2_margin"] == pytest.approx(
        (top.values[0] - top.values[1]).item()) and diff["reference_top2_margin"] >= 0


def test_tf32_off_is_restored():
    gcheck = _module()
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with gcheck.tf32_off() as settings:
            assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32
        assert settings["float32_matmul_precision"] == "highest" and not settings["cudnn_allow_tf32"]
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(saved)


def test_failed_preflight_stops_with_one_line(tmp_path):
    out = tmp_path / "r.json"
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'scripts')!r}]; import gpu_check as g; "
            f"g.preflight = lambda *a: 1 / 0; "
            f"g.main(['--small', '--device', 'cpu', '--out', {str(out)!r}])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "gpu_check: preflight failed, nothing else run: ZeroDivisionError" in proc.stderr
    report = json.loads(out.read_text())
    assert report["preflight"]["ok"] is False and "ZeroDivisionError" in report["preflight"]["error"]
    assert report["stages"] == {}


def test_a_failed_jobs_reason_is_its_workers_error_not_torchruns_banner(tmp_path):
    """The first H200 run's batched job failed with only torchrun's banner as its reason; the
    worker's own error line is what says why."""
    gcheck = _module()
    log = tmp_path / "job.log"
    log.write_text("\n".join([
        "INFO lp.jobs: 4 prompts", "[rank0]: Traceback (most recent call last):",
        "[rank0]:   File \"lp/decode/kv_cache.py\", line 256, in forward_logits",
        "[rank0]: RuntimeError: Expected mha_graph.execute(...).is_good() to be true, but got false.",
        "Traceback (most recent call last):",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60, "lp.run FAILED", "=" * 60]))
    assert gcheck.worker_error(log) == "RuntimeError: Expected mha_graph.execute(...).is_good() to be true, but got false."
    log.write_text("error: data.path: no such file\n" + "=" * 60)
    assert gcheck.worker_error(log) == "error: data.path: no such file"
    log.write_text("nothing went wrong\n")
    assert gcheck.worker_error(log) is None and gcheck.worker_error(tmp_path / "missing.log") is None


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
    assert not alive(worker)


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

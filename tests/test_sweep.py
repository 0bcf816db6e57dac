"""scripts/sweep.py: a two-point CPU sweep (P = 1 and 2, tiny model), its CSV, plots and cost model
figures; a rerun does no work; a failing point is recorded and the others still run (and stays failed
on a rerun); a timed-out point leaves no worker behind; bad world sizes are refused; a rerun whose job
config changed is refused; a resumed point's partial-run throughput is left empty; the verify time is
cached per W, N, G and rows; a bad sweep file is refused in one line; a rerun under a config lp refuses
fails its points; error records are counted and warned of; a refused multi-rank point keeps rank 0's line;
a batched point gets no cost projection."""
import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lp.processes import stop_tree

ROOT = Path(__file__).resolve().parents[1]
PLOTS = ("speedup_vs_world_size.png", "compression_vs_rows.png", "tokens_per_second_vs_world_size.png",
         "latency_vs_throughput.png")
BASE = {
    "model": {"name": "tiny-random-llama?vocab=64&seed=0", "dtype": "float32", "device": "cpu"},
    "lookahead": {"window": 4, "ngram": 4, "guesses": 4},
    "generation": {"max_new_tokens": 16, "stop": []},
    "data": {"source": "jsonl", "path": str(ROOT / "configs" / "prompts-example.jsonl"), "limit": 2},
    "distributed": {"backend": "gloo", "timeout_s": 60},
    "baseline": {"enabled": True},
}


def close(value):
    """The CSV writes 6 significant digits."""
    return pytest.approx(value, rel=1e-4, abs=1e-5)


def sweep(tmp, grid, *extra, base=BASE, status=0):
    """Run a sweep; its exit status is `status` (1: every point failed)."""
    spec = tmp / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": base, "grid": grid}))
    out = tmp / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep.py"), "--config", str(spec),
                           "--output", str(out), *extra], capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(out / "sweep.csv", newline="") as f:
        return out, proc.stdout, list(csv.DictReader(f))


@pytest.fixture(scope="module")
def two_points(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    return tmp, *sweep(tmp, {"world_size": [1, 2]})


def test_two_point_sweep_csv_and_plots(two_points):
    tmp, out, stdout, rows = two_points
    assert len(rows) == 2
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [int(r["world_size"]) for r in rows] == [1, 2]
    for r in rows:
        f = {k: float(v) for k, v in r.items() if k not in ("point", "status", "error", "backend")}
        summary = json.loads((out / "points" / r["point"] / "summary.json").read_text())
        for key in ("new_tokens", "rounds", "compression", "tokens_per_second", "speedup", "rows_per_round",
                    "max_rows_per_round", "decode_seconds"):      # the CSV carries the point's own summary
            assert f[key] == close(summary[key]), key
        assert f["new_tokens"] > 0 and f["rounds"] > 0 and f["compression"] >= 1
        assert f["speedup"] == close(f["tokens_per_second"] / f["baseline_tokens_per_second"])
        assert f["max_rows_per_round"] >= f["rows_per_round"] > 0
        # the cost model's figures hold together: measured = decode time per round, projected = its
        # four terms, error = projected / measured - 1, speedup = S * t_fwd(1) / projected
        assert f["measured_round_ms"] == close(1000 * f["decode_seconds"] / f["rounds"])
        assert f["projected_round_ms"] == close(f["projected_forward_ms"] + f["verify_ms"]
                                                + f["collective_ms"] + f["host_ms_per_round"])
        assert f["projection_error"] == close(f["projected_round_ms"] / f["measured_round_ms"] - 1)
        assert f["verify_ms"] > 0 and f["projected_forward_ms"] > 0 and f["projected_speedup"] > 0
    assert rows[0]["backend"] and rows[1]["backend"] == "gloo"
    # torchrun at world 1: a group of one exchanges nothing, and the cost model charges nothing
    assert float(rows[0]["collective_ms"]) == 0 and float(rows[0]["collectives_per_round"]) == 0
    assert float(rows[1]["collectives_per_round"]) == 2 and float(rows[1]["collective_ms"]) > 0
    # the rows each rank really fed: with two ranks the busiest feeds fewer than one worker does
    assert float(rows[1]["max_rows_per_round"]) < float(rows[0]["max_rows_per_round"])
    for name in PLOTS:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert "projected" in stdout and "measured" in stdout
    # the cost model's projection of every split of 8 workers, from the one-worker point's curve
    table = stdout.split("projected splits of 8 workers")[1].splitlines()
    assert [line.split()[:3] for line in table[2:6]] == [["1", "x", "8"], ["2", "x", "4"], ["4", "x", "2"],
                                                        ["8", "x", "1"]]


def test_rerun_does_no_work(two_points):
    tmp, out, _, rows = two_points
    summaries = sorted((out / "points").glob("*/summary.json"))
    assert len(summaries) == 2
    before = {p: p.stat().st_mtime_ns for p in [*summaries, *(out / "logs").glob("*.log"), *(out / "cost").glob("*")]}
    t0 = time.perf_counter()
    _, stdout, again = sweep(tmp, {"world_size": [1, 2]})
    assert stdout.count("skip") == 2
    assert {p: p.stat().st_mtime_ns for p in before} == before   # no job ran, nothing was measured again
    assert [r["status"] for r in again] == ["ok", "ok"]
    assert [r["measured_round_ms"] for r in again] == [r["measured_round_ms"] for r in rows]
    assert time.perf_counter() - t0 < 30


def test_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    out, stdout, rows = sweep(tmp_path, {"world_size": [1], "lookahead.window": [-1, 3]}, "--no-cost-model")
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert "lookahead.window: -1" in rows[0]["error"]
    assert rows[0]["lookahead.window"] == "-1" and rows[1]["lookahead.window"] == "3"
    assert int(rows[1]["new_tokens"]) > 0
    for name in PLOTS:
        assert (out / name).stat().st_size > 0


def test_lp_size_grid_key_gives_one_latency_throughput_point_per_split(tmp_path):
    """lp_size is a grid key next to world_size: P = 2 as two groups of one runs (dp 2), lp_size 3
    does not divide 2 and fails with lp.run's own message; the latency/throughput table and plot."""
    out, stdout, rows = sweep(tmp_path, {"world_size": [2], "lp_size": [1, 3]}, "--no-cost-model")
    assert [r["status"] for r in rows] == ["ok", "failed"]
    assert [r["point"] for r in rows] == ["P2_L1", "P2_L3"]
    assert "distributed.lp_size: 3 must divide the world size 2" in rows[1]["error"]
    ok = rows[0]
    assert (int(ok["dp_size"]), int(ok["lp_size"]), int(ok["world_size"])) == (2, 1, 2)
    assert float(ok["job_tokens_per_second"]) > 0 and float(ok["wall_seconds"]) > 0
    assert float(ok["latency_max_s"]) >= float(ok["latency_p95_s"]) >= float(ok["latency_p50_s"]) > 0
    assert sorted((out / "points" / "P2_L1").glob("results*.jsonl"))     # per-group files, summed
    line = next(line for line in stdout.splitlines() if line.startswith("P2_L1"))
    assert line.split()[1:4] == ["2", "x", "1"]
    s, rows_per_round = (float(v) for v in line.split()[4:6])      # S beside the rows that bought it
    assert (s, rows_per_round) == (round(float(ok["compression"]), 2), round(float(ok["rows_per_round"]), 1))
    assert (out / "latency_vs_throughput.png").stat().st_size > 0


def test_a_point_that_decodes_nothing_stays_failed_on_a_rerun(tmp_path):
    """lp.run writes the summary of a job whose every prompt is an error record (and exits 1): a rerun
    does not take that summary for a finished point, and the latency table shows it without figures.
    A sweep whose every point failed exits 1, as such a job does."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"task_id": "e", "prompt": ""}\n')
    for _ in range(2):
        out, stdout, rows = sweep(tmp_path, {"world_size": [1]}, "--no-cost-model", status=1,
                                  base={**BASE, "data": {"source": "jsonl", "path": str(empty)}})
        assert [r["status"] for r in rows] == ["failed"], stdout
        assert "no prompt could be decoded" in rows[0]["error"] and "skip" not in stdout


@pytest.mark.parametrize("values", [["two"], 1.5, [True]])
def test_a_world_size_that_is_not_an_integer_is_refused(tmp_path, values):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": BASE, "grid": {"world_size": values}}))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep.py"), "--config", str(spec), "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "must be integers" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_timed_out_point_leaves_no_worker_running(tmp_path):
    """--timeout stops the point's whole process group (torchrun and its workers), not torchrun alone."""
    out, stdout, rows = sweep(tmp_path, {"world_size": [2]}, "--no-cost-model", "--timeout", "8",
                              base=slow_base(tmp_path), status=1)
    assert rows[0]["status"] == "failed" and "timed out after 8 s" in rows[0]["error"]
    assert running_under(out / "points") == []


def slow_base(tmp_path) -> dict:
    """A base job of a minute or more of decoding (EOS ends each prompt early), to be cut short."""
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"def f{i}(x):"}) + "\n" for i in range(2000)))
    return {**BASE, "generation": {"max_new_tokens": 64, "stop": []}, "baseline": {"enabled": False},
            "data": {"source": "jsonl", "path": str(many), "limit": None}}


def running_under(directory: Path) -> list[str]:
    """The command lines of running processes (zombies aside) that name `directory`."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if entry.name.isdigit() and str(directory) in cmdline and not _dead(int(entry.name)):
            alive.append(cmdline)
    return alive


def test_the_world_size_plots_draw_one_line_per_lp_split(tmp_path, monkeypatch):
    """With several lp_size values the speedup and tokens/s plots label each split's line (they drew
    P2_L1 and P2_L2 as one unlabelled line)."""
    import matplotlib.axes

    module = _script(monkeypatch)
    labels = []
    real = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **kw: labels.append(kw.get("label")) or real(self, *a, **kw))
    rows = [{"point": f"P{p}_L{lp}", "status": "ok", "world_size": p, "lp_size": lp, "dp_size": p // lp,
             "speedup": 1.0 + p / lp, "tokens_per_second": 10.0 * p, "baseline_tokens_per_second": 9.0}
            for p, lp in ((1, 1), (2, 1), (2, 2))]
    module.plot(rows, {"world_size": [1, 2], "lp_size": [1, 2]}, tmp_path)
    assert {"lp_size=1", "lp_size=2"} <= set(labels)



def test_a_sweep_without_a_baseline_says_why_its_speedup_plot_is_empty(tmp_path, monkeypatch):
    """Finished points without a baseline have no speedup: the plot said nothing (its 1.0 line counted
    as data, so 'no finished points' never showed); it now says why. The tokens/s plot names what it
    draws: one request's decode speed."""
    import matplotlib.axes

    module = _script(monkeypatch)
    texts, ylabels = [], []
    real_text, real_ylabel = matplotlib.axes.Axes.text, matplotlib.axes.Axes.set_ylabel
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, x, y, s, *a, **kw: texts.append(s)
                        or real_text(self, x, y, s, *a, **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel", lambda self, label, *a, **kw: ylabels.append(label)
                        or real_ylabel(self, label, *a, **kw))
    rows = [{"point": f"P{p}", "status": "ok", "world_size": p, "lp_size": p, "dp_size": 1,
             "tokens_per_second": 10.0 * p, "compression": 2.0, "rows_per_round": 20.0} for p in (1, 2)]
    module.plot(rows, {"world_size": [1, 2]}, tmp_path)
    assert "no speedup: the base job has no baseline" in texts
    assert "per-request tokens / s (decode)" in ylabels


def _dead(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ")[1][0] == "Z"


def _launch(tmp_path, worker: str, session: bool, forward: bool) -> tuple[subprocess.Popen, list[int]]:
    """A stand-in for torchrun: a launcher in a session of its own starting two workers (in sessions of
    their own, as torchrun starts them, or in its group), forwarding SIGTERM to them or not; the
    workers' pids once both run."""
    pids = tmp_path / "pids"
    worker = f"import os, signal, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); " + worker
    launcher = ("import signal, subprocess, sys, time\n"
                f"ws = [subprocess.Popen([sys.executable, '-c', {worker!r}], start_new_session={session}) "
                "for _ in range(2)]\n"
                + ("signal.signal(signal.SIGTERM, lambda *a: [w.send_signal(signal.SIGTERM) for w in ws])\n"
                   if forward else "")
                + "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    deadline = time.monotonic() + 30
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, [int(p) for p in pids.read_text().split()]


@pytest.mark.parametrize("session", [True, False], ids=["own-session", "launcher-group"])
def test_stopping_a_point_ends_workers_that_ignore_sigterm(tmp_path, session):
    """torchrun starts each worker in a session of its own, out of reach of a kill of torchrun's group:
    stop_tree ends them too, and workers that ignore SIGTERM in the launcher's group, with SIGKILL after
    the grace, and returns (before, the sweep waited on such a worker's open pipes until it ended)."""
    proc, workers = _launch(tmp_path, "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
                            session, forward=False)
    start = time.perf_counter()
    stop_tree(proc, grace_s=1.0)
    assert time.perf_counter() - start < 10 and proc.returncode is not None
    time.sleep(0.5)
    assert all(_dead(pid) for pid in workers), "a worker outlived stop_tree"


def test_stopping_a_point_ends_what_is_left_in_its_group(tmp_path):
    """A process of the launcher's group that is no longer under it (its parent exited: double-forked)
    and ignores SIGTERM: stop_tree's SIGKILL to the group ends it too."""
    pid_file = tmp_path / "orphan"
    orphan = (f"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    middle = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {orphan!r}])"   # and exits
    launcher = (f"import subprocess, sys, time; subprocess.run([sys.executable, '-c', {middle!r}]); "
                "time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    orphan_pid = int(pid_file.read_text())
    stop_tree(proc, grace_s=1.0)
    time.sleep(0.5)
    assert _dead(orphan_pid), "a process of the launcher's group outlived stop_tree"


def test_stopping_a_point_sends_each_worker_one_sigterm(tmp_path):
    """torchrun passes its SIGTERM on to its workers: stop_tree sends SIGTERM to torchrun's group only, so
    a worker's handler (lp.run's: keep the records, exit 143) runs once (before, twice: one of the
    reviewed runs raised it again inside the first one's exit)."""
    log = tmp_path / "sigterms"
    worker = (f"signal.signal(signal.SIGTERM, lambda *a: (open({str(log)!r}, 'a').write('TERM\\n'), "
              "time.sleep(0.5), os._exit(143))); time.sleep(600)")
    proc, workers = _launch(tmp_path, worker, session=True, forward=True)
    stop_tree(proc, grace_s=5.0)
    assert log.read_text().split() == ["TERM", "TERM"]       # one for each of the two workers
    assert all(_dead(pid) for pid in workers)


@pytest.mark.parametrize("timeout", ["-5", "0", "nan"])
def test_a_timeout_of_no_seconds_is_refused(tmp_path, timeout):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": BASE, "grid": {"world_size": [1]}}))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep.py"), "--config", str(spec), "--output",
                           str(tmp_path / "out"), "--timeout", timeout], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--timeout" in proc.stderr and not (tmp_path / "out").exists()


def test_a_sweep_stopped_by_sigterm_stops_its_point(tmp_path):
    """SIGTERM (or SIGHUP) to the sweep ends it as Ctrl-C does: the running point's torchrun and workers,
    in sessions of their own, are stopped with it (before, they went on running), and its log is written."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": slow_base(tmp_path), "grid": {"world_size": [1]}}))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "sweep.py"), "--config", str(spec), "--output",
                             str(out), "--no-cost-model"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = out / "points" / "P1" / "results.jsonl"
    deadline = time.monotonic() + 120
    while not (results.exists() and results.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert results.exists(), "the point never wrote a record"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    time.sleep(1)
    assert running_under(out / "points") == []
    log = (out / "logs" / "P1.log").read_text()       # the stopped point's output is kept (it was not)
    assert log.startswith("$ ") and "--- stderr" in log


def _script(monkeypatch):
    """scripts/sweep.py as a module (its bench_util found as running the script finds it)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("sweep_script", ROOT / "scripts" / "sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_sweep_file(tmp, spec: dict, out) -> subprocess.CompletedProcess:
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep.py"), "--config", str(path), "--output",
                           str(out), "--no-cost-model"], capture_output=True, text=True, timeout=600, cwd=tmp)


@pytest.fixture(scope="module")
def one_point(tmp_path_factory):
    """A finished one-point sweep (P1: two prompts), to copy and change."""
    tmp = tmp_path_factory.mktemp("one")
    out, _, rows = sweep(tmp, {"world_size": [1]}, "--no-cost-model")
    assert [r["status"] for r in rows] == ["ok"]
    return out


def test_a_rerun_with_a_changed_job_config_is_refused(tmp_path, one_point):
    """A finished point whose job config changed since was skipped, its old figures reported as the new
    config's: the sweep is refused up front (exit 2, one line naming the point and the keys); a change that
    leaves the figures as they are (the collectives' timeout) still skips it."""
    import shutil

    out = shutil.copytree(one_point, tmp_path / "out")
    summary = (out / "points" / "P1" / "summary.json").read_text()
    proc = run_sweep_file(tmp_path, {"base": {**BASE, "generation": {"max_new_tokens": 8, "stop": []}},
                                     "grid": {"world_size": [1]}}, out)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "P1 (generation.max_new_tokens: 16 -> 8)" in proc.stderr and "another --output" in proc.stderr
    assert "skip" not in proc.stdout and (out / "points" / "P1" / "summary.json").read_text() == summary
    proc = run_sweep_file(tmp_path, {"base": {**BASE, "distributed": {"backend": "gloo", "timeout_s": 90}},
                                     "grid": {"world_size": [1]}}, out)
    assert proc.returncode == 0 and "skip (finished)" in proc.stdout, proc.stdout + proc.stderr


def test_a_resumed_point_reports_no_partial_throughput(tmp_path, one_point):
    """A point interrupted mid-job and resumed by a rerun: its summary's wall time and job throughput cover
    only the prompts the resumed run decoded, so the CSV leaves them empty (with prompts and job_prompts
    beside them) and the sweep says why; the whole-job figures (S, latency) stay."""
    import shutil

    out = shutil.copytree(one_point, tmp_path / "out")
    point = out / "points" / "P1"
    (point / "summary.json").unlink()          # as a sweep stopped before the job's end leaves it
    results = point / "results.jsonl"
    results.write_text(results.read_text().splitlines(keepends=True)[0])
    _, stdout, rows = sweep(tmp_path, {"world_size": [1]}, "--no-cost-model")
    (row,) = rows
    assert row["status"] == "ok" and (row["prompts"], row["job_prompts"]) == ("2", "1")
    assert json.loads((point / "summary.json").read_text())["job_tokens_per_second"] > 0
    assert row["wall_seconds"] == row["job_prompts_per_second"] == row["job_tokens_per_second"] == ""
    assert float(row["compression"]) >= 1 and float(row["latency_p50_s"]) > 0
    assert "warning: P1 was resumed: its last run decoded 1 of 2 prompts" in stdout


def test_the_verify_time_is_cached_per_window_ngram_guesses_and_rows(tmp_path, monkeypatch):
    """measure_verify depends on W, N, G and the rows (and the model's vocabulary and device): two points
    that differ in the window measure it apart (they shared one figure, keyed by model and world alone)."""
    from lp.measure import cost_model

    module = _script(monkeypatch)
    calls = []
    monkeypatch.setattr(cost_model, "measure_job_curve", lambda cfg, prefix, concurrent: [[1, 0.001]])
    monkeypatch.setattr(cost_model, "measure_verify", lambda *a: calls.append(a[:4]) or 1e-4 * a[0])
    monkeypatch.setattr(cost_model, "project", lambda *a: {"measured_round_ms": 1.0, "projected_round_ms": 1.0})
    monkeypatch.setattr(module, "_vocab", lambda cfg: 64)
    summary = {"world_size": 1, "lp_size": 1, "max_rows_per_round": 20}
    figures = {}
    for window, guesses, rows in ((3, 4, 20), (7, 4, 20), (3, 2, 20), (3, 4, 40), (3, 4, 20)):
        base = {**BASE, "lookahead": {"window": window, "ngram": 4, "guesses": guesses}}
        raw = module.point_config(base, {"world_size": 1}, tmp_path / "points" / "P1")
        figures[window, guesses, rows] = module.cost_figures(
            {}, raw, {**summary, "max_rows_per_round": rows}, tmp_path)["verify_s"]
    assert calls == [(3, 4, 4, 20), (7, 4, 4, 20), (3, 4, 2, 20), (3, 4, 4, 40)]    # the last one cached
    assert figures[7, 4, 20] == pytest.approx(7e-4) and figures[3, 4, 20] == pytest.approx(3e-4)


@pytest.mark.parametrize("spec, message", [
    ({"base": "base.yaml"}, "cannot read base job config"),
    ({"output": 5}, "output must be a directory path (a string); got 5"),
    ({"outptu": "x"}, "unknown key 'outptu' (a sweep file has base, grid, output)"),
    ({"grid": {"output.dir": ["x"]}}, "grid key 'output.dir' cannot be swept"),
    ({"grid": {"world_size": [1, 1]}}, "grid.world_size lists 1 more than once"),
    ({"grid": {"data.path": ["a b.jsonl", "a_b.jsonl"]}}, "points path-a_b.jsonl would share a directory"),
    ({"grid": {"lp_size": [1], "distributed.lp_size": [2]}}, "'lp_size' and 'distributed.lp_size' name one"),
], ids=["base-not-yaml", "output-not-a-string", "unknown-key", "output-dir-in-grid", "duplicate-value",
        "same-point-name", "lp-size-twice"])
def test_a_bad_sweep_file_is_refused_in_one_line(tmp_path, spec, message):
    """Each was a traceback, or ran ignoring the key (a typo'd `outptu:`, a grid's output.dir), or ran a
    point twice (two identical CSV rows) or two points in one directory."""
    (tmp_path / "base.yaml").write_text("model: {name: [unclosed\n")
    proc = run_sweep_file(tmp_path, {"base": BASE, "grid": {"world_size": [1]}, **spec}, tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_misspelt_grid_is_named(tmp_path):
    """`grids:` for `grid:` got the generic 'a mapping with base: and grid:' line; it names the key now."""
    proc = run_sweep_file(tmp_path, {"base": BASE, "grids": {"world_size": [1]}}, tmp_path / "out")
    assert proc.returncode == 2 and "unknown key 'grids' (a sweep file has base, grid, output)" in proc.stderr


def test_a_rerun_with_an_invalid_job_config_fails_its_points(tmp_path, one_point):
    """A finished point whose base now has a misspelt key was skipped as finished, its old figures
    reported under a config lp.run refuses: the point fails with lp's own message instead."""
    import shutil

    out = shutil.copytree(one_point, tmp_path / "out")
    proc = run_sweep_file(tmp_path, {"base": {**BASE, "lookahead": {"window": 4, "ngram": 4, "windw": 15}},
                                     "grid": {"world_size": [1]}}, out)
    assert proc.returncode == 1 and "skip" not in proc.stdout, proc.stdout + proc.stderr
    assert "P1: failed" in proc.stdout and "lookahead.window" in proc.stdout


def test_a_point_with_error_records_says_so(tmp_path):
    """Error records count as the point's prompts in its prompts/s: the CSV has the errors beside the
    prompts, and the sweep warns."""
    prompts = tmp_path / "mixed.jsonl"
    prompts.write_text(json.dumps({"task_id": "short", "prompt": "def f(x):"}) + "\n"
                       + json.dumps({"task_id": "long", "prompt": "x = 1\n" * 60}) + "\n")
    base = {**BASE, "model": {**BASE["model"], "name": "tiny-random-llama?vocab=64&seed=0&max_pos=128"},
            "data": {"source": "jsonl", "path": str(prompts)}}
    out, stdout, rows = sweep(tmp_path, {"world_size": [1]}, "--no-cost-model", base=base)
    (row,) = rows
    assert row["status"] == "ok" and (row["prompts"], row["errors"]) == ("2", "1")
    assert "warning: P1: 1 of 2 prompts are error records" in stdout


def test_a_refused_multi_rank_point_records_rank_0s_line(monkeypatch):
    """Under torchrun the other ranks of a job rank 0 refused each print a line naming rank 0's: the
    point's error is rank 0's own line, wherever it falls among theirs."""
    script = _script(monkeypatch)
    other = "error: rank 1: global rank 0 refused the job at startup (exit 2): its error line says why"
    own = "error: cannot load model 'no-such-model': not a built-in name"
    for lines in ([own, other], [other, own], [other, own, other]):
        assert script.last_error_line("\n".join(["starting", *lines, "torchrun: failures"])) == own
    assert script.last_error_line(other) == other


def test_a_batched_point_gets_no_projection(tmp_path):
    """The cost model prices one request per forward; a batched point's per-round figures are shared by
    the requests of a forward, and its projection was taken as if they were not. It gets none now."""
    base = {k: v for k, v in BASE.items() if k != "baseline"}
    out, stdout, rows = sweep(tmp_path, {"world_size": [1], "generation.batch_size": [2]}, base=base)
    (row,) = rows
    assert row["status"] == "ok" and row["projected_round_ms"] == "" and row["measured_round_ms"] == ""
    assert "cost model: no projection for P1_batch_size-2, a batched point" in stdout, stdout

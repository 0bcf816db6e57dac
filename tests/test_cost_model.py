"""The cost model's pure functions on synthetic data, and its forward-curve measurement."""
import math

import pytest

from lp.measure import cost_model as cm


def line(a, b, rows=cm.ROWS):
    return [{"rows": r, "seconds": a + b * r} for r in rows]


def test_fit_recovers_a_linear_function():
    a, b = cm.fit_linear(line(0.002, 0.00003))
    assert math.isclose(a, 0.002, rel_tol=1e-9) and math.isclose(b, 0.00003, rel_tol=1e-9)


def test_fit_of_noisy_points_is_least_squares():
    curve = [{"rows": 1, "seconds": 1.0}, {"rows": 2, "seconds": 3.0}, {"rows": 3, "seconds": 2.0}]
    a, b = cm.fit_linear(curve)
    assert math.isclose(b, 0.5) and math.isclose(a, 1.0)


def test_forward_time_interpolates_and_extrapolates():
    curve = [{"rows": 1, "seconds": 1.0}, {"rows": 4, "seconds": 1.0}, {"rows": 8, "seconds": 3.0}]
    assert cm.forward_time(curve, 1) == 1.0
    assert cm.forward_time(curve, 2.5) == 1.0                  # flat part (a GPU below its knee)
    assert math.isclose(cm.forward_time(curve, 6), 2.0)
    assert math.isclose(cm.forward_time(curve, 16), 7.0)      # past the last point: the last slope
    assert cm.forward_time(line(0.001, 0.0001), 100) == pytest.approx(0.011)
    with pytest.raises(ValueError):
        cm.forward_time([], 1)
    spiky = [{"rows": 1, "seconds": 1.0}, {"rows": 2, "seconds": 5.0}, {"rows": 4, "seconds": 2.0}]
    assert cm.forward_time(spiky, 2) == 2.0 and math.isclose(cm.forward_time(spiky, 1.5), 1.5)


def test_projection_formula():
    curve = line(0.010, 0.0001)                      # t_fwd(1) = 10.1 ms, t_fwd(40) = 14 ms
    round_s = cm.project_round_seconds(curve, max_rows=40, collective_s=0.0005, host_s=0.0015)
    assert round_s == pytest.approx(0.014 + 0.0005 + 0.0015)
    assert cm.projected_speedup(2.5, curve, round_s) == pytest.approx(2.5 * 0.0101 / 0.016)
    summary = {"rounds": 10, "decode_seconds": 0.2, "host_ms_per_round": 1.5, "max_rows_per_round": 40,
               "compression": 2.5}
    p = cm.project(summary, curve, 0.0005)
    assert p["projected_round_ms"] == pytest.approx(16.0) and p["measured_round_ms"] == pytest.approx(20.0)
    assert p["projected_forward_ms"] == pytest.approx(14.0) and p["collective_ms"] == pytest.approx(0.5)
    assert p["projected_speedup"] == pytest.approx(2.5 * 10.1 / 16.0)


def test_forward_curve_measures_every_row_count(tiny_model64):
    curve = cm.forward_curve(tiny_model64, prefix=8, rows_list=[1, 4, 16], repeats=1)
    assert [p["rows"] for p in curve] == [1, 4, 16] and all(p["seconds"] > 0 for p in curve)


def test_round_forward_is_the_engines_forward(tiny_model64):
    """The measured forward is the engine's (lp.decode.batch's forward_logits on a round cache): a prefix
    round, then the round, every row's logits."""
    from lp.decode import batch as kv_cache

    seen = []
    original = kv_cache.forward_logits

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]
    kv_cache.forward_logits = spy
    try:
        cm.round_forward(tiny_model64, prefix=5, rows=3)()
    finally:
        kv_cache.forward_logits = original
    assert len(seen) == 2 and seen[-1].shape[:2] == (1, 3)         # the prefix, then the measured round


def test_a_batched_probe_prefills_once_and_copies_the_prefix(tiny_model64):
    """A batch's grid probe runs one prefill (row 0's) and copies its K/V to the other cache rows:
    every row holds the prefix it attends over, at one prefill's cost whatever the batch."""
    from lp.decode import batch as packing
    from lp.decode.kv_cache import round_cache

    calls = []
    original = packing.forward_round

    def counted(*args, **kwargs):
        calls.append(args[2])                     # requests in the forward
        return original(*args, **kwargs)
    packing.forward_round = counted
    try:
        runs = cm._probe_rounds(tiny_model64, 6, 3, [1, 2])
    finally:
        packing.forward_round = original
    assert calls == [1]                           # the one prefill; the probes have not run yet
    for buffer in round_cache(tiny_model64, 6 + 2, 3).buffers:
        prefix = buffer[:, :, :, :6]
        assert prefix[:, 0].abs().sum() > 0 and all(prefix[:, r].equal(prefix[:, 0]) for r in (1, 2))
    runs[2]()                                     # and a probe of the three rows runs over that cache


def test_bare_collective_latency():
    assert cm.measure_collective(1) == 0.0
    assert 0 < cm.measure_collective(2, numel=8, repeats=5) < 1.0


def test_verification_time_is_measured():
    assert 0 < cm.measure_verify(window=4, ngram=4, guesses=4, rows=20, vocab=64, repeats=3) < 1.0
    curve = line(0.001, 0.0)
    assert cm.project_round_seconds(curve, 8, 0.0, 0.0, verify_s=0.0005) == pytest.approx(0.0015)


def test_project_splits_of_eight_workers():
    """Every dp x lp split of 8: rows per rank shrink with lp, throughput is dp requests in flight,
    latency is the request's rounds times the round; a flat (GPU-like) curve favours dp."""
    flat = [{"rows": r, "seconds": 0.010} for r in cm.ROWS]
    rows = cm.project_splits(flat, 8, compression=2.0, rows_per_round=33, tokens_per_request=100,
                             host_s=0.001, verify_s=0.0, gather_s=0.0005)
    assert [(r["dp"], r["lp"]) for r in rows] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert [r["max_rows"] for r in rows] == [5.0, 9.0, 17.0, 33.0]
    assert rows[0]["round_ms"] == pytest.approx(10 + 1 + 1.5)          # ceil(log2 8) = 3 doublings
    assert rows[-1]["round_ms"] == pytest.approx(11.0)
    for r in rows:
        assert r["latency_s"] == pytest.approx(100 / 2.0 * r["round_ms"] / 1000)
        assert r["tokens_per_s"] == pytest.approx(r["dp"] * 2.0 / (r["round_ms"] / 1000))
        assert r["prompts_per_s"] == pytest.approx(r["tokens_per_s"] / 100)
    assert cm.splits(6) == [(1, 6), (2, 3), (3, 2), (6, 1)]
    assert "8 x 1" in cm.splits_table(rows)


def test_cost_model_command_reads_a_gpu_check_report(tmp_path, capsys):
    import json

    report = {"models": {"7b": {"eager": {"forward_curve": line(0.02, 0.00001)}}}}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(report))
    assert cm.find_curve(report) == line(0.02, 0.00001)
    cm.main(["--curve", str(path), "--compression", "2.5", "--rows", "81", "--tokens", "200", "--host-ms", "1"])
    out = capsys.readouterr().out
    assert [l.split()[:3] for l in out.splitlines()[2:]] == [["1", "x", "8"], ["2", "x", "4"], ["4", "x", "2"],
                                                             ["8", "x", "1"]]


def test_a_report_of_several_curves_needs_one_chosen(tmp_path, capsys):
    """gpu_check's report holds a curve per stage and model: the command took the first without a word
    (a 7B's curve for a SmolLM2 summary). It now names them and takes the one --curve-of picks."""
    import json

    report = {"stages": {"eager": {"llama-7b": {"forward_curve": line(0.028, 0.0001)},
                                   "codellama-7b": {"forward_curve": line(0.030, 0.0001)},
                                   "smollm2-135m": {"forward_curve": line(0.008, 0.00001)}}}}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(report))
    figures = ["--compression", "2.5", "--rows", "81", "--tokens", "200", "--host-ms", "1"]
    with pytest.raises(SystemExit) as exit_:
        cm.main(["--curve", str(path), *figures])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "holds 3 forward curves" in err
    assert "stages/eager/llama-7b/forward_curve, stages/eager/codellama-7b/forward_curve, " in err
    cm.main(["--curve", str(path), "--curve-of", "smollm2", *figures])        # a part of a part
    assert "t_fwd(1) = 8.010 ms" in capsys.readouterr().out
    cm.main(["--curve", str(path), "--curve-of", "llama-7b", *figures])       # the whole part, not codellama's
    assert "t_fwd(1) = 28.100 ms" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cm.main(["--curve", str(path), "--curve-of", "qwen", *figures])
    assert "no forward curve in" in capsys.readouterr().err


@pytest.mark.parametrize("summary,given,message", [
    ({"mean_batch": 4.2}, [], "is a batched run's (4.20 requests per forward)"),
    ({"lp_size": 2}, [], "is an LP group's (lp_size 2): its rows and host ms per round are rank 0's share"),
    ({"lp_size": 2}, ["--rows", "30"], "is an LP group's"),
])
def test_a_summary_the_model_cannot_read_is_refused(tmp_path, capsys, summary, given, message):
    """The model prices a round as one worker's forward of one request: a batched run's per-round figures
    (the requests share forwards) and an LP rank's rows (its share of the group's) are not that, and were
    taken without a word. Refused unless the figures they would give come as options."""
    import json

    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps(line(0.02, 0.00001)))
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"compression": 2.0, "rows_per_round": 21.9, "host_ms_per_round": 1.2, "prompts": 3,
                                "errors": 0, "new_tokens": 96, "mean_batch": 1.0, "lp_size": 1, **summary}))
    with pytest.raises(SystemExit) as exit_:
        cm.main(["--curve", str(curve), "--summary", str(path), *given])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    cm.main(["--curve", str(curve), "--summary", str(path), "--rows", "30", "--host-ms", "1"]
            + (["--compression", "2", "--tokens", "32"] if "mean_batch" in summary else []))
    assert "30.0 rows/round on one worker" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--curve", "{missing}"], "--curve: cannot read {missing}: No such file or directory"),
    (["--curve", "{bad}"], "--curve: cannot read {bad}: Expecting"),
    (["--curve", "{curve}", "--summary", "{missing}"], "--summary: cannot read {missing}"),
    (["--curve", "{curve}", "--compression", "0", "--rows", "8", "--tokens", "9"],
     "--compression: 0.0 must be a finite number >= 1"),
    (["--curve", "{curve}", "--compression", "inf", "--rows", "0.5", "--tokens", "9", "--host-ms", "-1"],
     "--compression: inf must be a finite number >= 1; --rows: 0.5 must be a finite number >= 1; "
     "--host-ms: -1.0 must be a finite number >= 0"),
    (["--curve", "{curve}", "--compression", "2", "--rows", "8", "--tokens", "9", "--verify-ms", "-0.1",
      "--gather-ms", "nan"], "--verify-ms: -0.1 must be a finite number >= 0; --gather-ms: nan must be"),
    (["--curve", "{strings}", "--compression", "2", "--rows", "8", "--tokens", "9"],
     "--curve: {strings} holds points whose rows and seconds are not finite numbers >= 0: [{{'rows': 'x'"),
    (["--curve", "{curve}", "--summary", "{summary}"], "--compression (from --summary): 0.5 must be a finite number"),
    (["--curve", "{curve}", "--compression", "2", "--rows", "8", "--tokens", "9", "--world", "0"],
     "--world: 0 must be >= 1"),
])
def test_cost_model_command_errors_are_one_line(tmp_path, capsys, args, message):
    """Unreadable files, figures that are no S, R or time (0, inf, NaN, below 1 row, negative), a curve of
    no numbers, and no workers: argparse's one-line error, exit 2."""
    import json

    paths = {"missing": tmp_path / "none.json", "bad": tmp_path / "bad.json", "curve": tmp_path / "curve.json",
             "strings": tmp_path / "strings.json"}
    paths["bad"].write_text("{")
    paths["curve"].write_text(json.dumps(line(0.02, 0.00001)))
    paths["strings"].write_text(json.dumps([{"rows": "x", "seconds": 1.0}, {"rows": 2, "seconds": 1.0}]))
    paths["summary"] = tmp_path / "summary.json"
    paths["summary"].write_text(json.dumps({"compression": 0.5, "rows_per_round": 8, "prompts": 1, "errors": 0,
                                            "new_tokens": 9}))
    with pytest.raises(SystemExit) as exit_:
        cm.main([a.format(**paths) for a in args])
    assert exit_.value.code == 2 and message.format(**paths) in capsys.readouterr().err


def test_a_row_count_measured_twice_reads_its_least_time():
    """A curve that holds one row count twice (two measurements merged) interpolates, not divides by 0."""
    curve = [{"rows": 1, "seconds": 0.010}, {"rows": 8, "seconds": 0.030}, {"rows": 8, "seconds": 0.020},
             {"rows": 16, "seconds": 0.040}]
    assert cm.monotone([(p["rows"], p["seconds"]) for p in curve]) == [(1, 0.010), (8, 0.020), (16, 0.040)]
    assert cm.forward_time(curve, 8) == pytest.approx(0.020)
    assert cm.forward_time(curve, 12) == pytest.approx(0.030) and cm.forward_time(curve, 4) == pytest.approx(
        0.010 + 0.010 * 3 / 7)


def test_batched_forward_time_reads_between_measured_batch_sizes():
    """The row budget's grid measures a few request counts (lp.measure.cost_model.curve_batches); the sizes
    between are read linearly from the two on either side, at the same rows per request."""
    grid = [{"batch": b, "rows": r, "seconds": 0.1 * b + 0.01 * b * r} for b in (1, 4, 16) for r in (1, 8, 64)]
    for b, r in ((1, 8), (4, 64), (16, 1)):                   # measured cells are read as they are
        assert cm.batch_forward_time(grid, b, r) == pytest.approx(0.1 * b + 0.01 * b * r)
    for b, r in ((2, 8), (8, 1), (12, 64), (8, 4.5)):         # linear in b and in r: read exactly
        assert cm.batch_forward_time(grid, b, r) == pytest.approx(0.1 * b + 0.01 * b * r)
    bent = [{"batch": b, "rows": 1, "seconds": s} for b, s in ((1, 1.0), (4, 1.0), (16, 4.0))]
    assert cm.batch_forward_time(bent, 2, 1) == pytest.approx(1.0)        # flat below 4 requests
    assert cm.batch_forward_time(bent, 10, 1) == pytest.approx(2.5)       # halfway from 4 to 16


def test_the_grid_measures_1_4_16_requests_and_the_batch_size():
    from lp.measure.cost_model import curve_batches
    assert [curve_batches(b) for b in (1, 2, 4, 6, 16, 20, 64)] == [
        [1], [1, 2], [1, 4], [1, 4, 6], [1, 4, 16], [1, 4, 16, 20], [1, 4, 16, 64]]


def test_a_batch_past_the_grids_row_cap_still_gets_its_fewest_rows(tiny_model64):
    """batch_curve keeps at most `most` rows per probe; a batch of more requests than that (a job's
    generation.batch_size 513 against 512) is measured at its fewest rows each, not left out (which
    ended the job's start-up in max() of nothing)."""
    curve = cm.batch_curve(tiny_model64, 4, [1, 3], [1, 2, 4], repeats=1, most=2)
    assert [(p["batch"], p["rows"]) for p in curve] == [(1, 1), (1, 2), (3, 1)]
    assert all(p["seconds"] > 0 for p in curve)
    assert cm.batch_forward_time(curve, 3, 2) > 0

"""scripts/arch_sweep.py: the causal-LM types lp.tiny does not build, each decoded against generate in float64.
A few types in the default suite (an exact one, a refused one, through the child process and the command
line); a wrong decode, an error and a hang in lp are reported as failures; the whole sweep under -m slow."""
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import arch_sweep  # noqa: E402


def test_the_sweep_covers_what_the_matrix_does_not():
    from lp.tiny import FAMILIES, family_config
    swept = arch_sweep.swept_types()
    assert len(swept) > 50
    assert not {family_config(f).model_type for f in FAMILIES} & set(swept)
    assert {"olmo", "mpt", "bert"} <= set(swept)


def test_an_exact_type_and_a_refused_one():
    exact = arch_sweep.sweep_one("olmo")
    assert exact["verdict"] == "exact"
    assert all(d["equal"] for d in exact["details"])
    assert sorted((d["setting"], d["prompt"]) for d in exact["details"]) == sorted(
        [(s, i) for s in ("default", "tree", "batch") for i in range(4)] + [("drop-in", i) for i in range(3)])
    refused = arch_sweep.sweep_one("mpt")
    assert refused["verdict"] == "refused" and "mpt" in refused["why"]


def test_a_wrong_decode_and_an_lp_error_are_failures(monkeypatch):
    """lp.generate made wrong at one token, or failing; and the drop-in made wrong."""
    import lp
    real = lp.generate

    def off_by_one(model, prompts, **kwargs):
        out = real(model, prompts, **kwargs)
        out[0].token_ids[-1] = (out[0].token_ids[-1] + 1) % 512
        return out
    monkeypatch.setattr(lp, "generate", off_by_one)
    wrong = arch_sweep.sweep_one("olmo")
    assert wrong["verdict"] == "WRONG" and "new token 39" in wrong["why"]

    def fails(model, prompts, **kwargs):
        raise RuntimeError("mask of the wrong shape")
    monkeypatch.setattr(lp, "generate", fails)
    error = arch_sweep.sweep_one("olmo")
    assert error["verdict"] == "LP-ERROR" and "mask of the wrong shape" in error["why"]

    monkeypatch.setattr(lp, "generate", real)
    lookahead = lp.lookahead

    @functools.wraps(lookahead)         # generate reads its signature for the lookahead keys
    def drop_in_off_by_one(model, *args, **kwargs):
        out = lookahead(model, *args, **kwargs)
        out[1, -1] = (out[1, -1] + 1) % 512
        return out
    monkeypatch.setattr(lp, "lookahead", drop_in_off_by_one)
    wrong = arch_sweep.sweep_one("olmo")
    assert wrong["verdict"] == "WRONG" and "prompt 1 (drop-in): first difference at new token 39" in wrong["why"]


@pytest.mark.parametrize("printed,verdict", [("STAGE build\n", "no model"), ("STAGE build\nSTAGE decode\n", "LP-ERROR")])
def test_a_hang_in_lp_is_a_failure_and_one_in_the_build_is_not(monkeypatch, printed, verdict):
    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"], output=printed)
    monkeypatch.setattr(subprocess, "run", hangs)
    got = arch_sweep.run_child("olmo", timeout=3)
    assert got["verdict"] == verdict and "within 3 s" in got["why"]


def test_the_command_line_exits_1_on_a_failure_only(tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep.json"
    assert arch_sweep.main(["--types", "olmo", "xlnet", "--json", str(out)]) == 0      # child processes
    assert [(r["type"], r["verdict"]) for r in json.loads(out.read_text())] == [("olmo", "exact"),
                                                                                  ("xlnet", "refused")]
    monkeypatch.setattr(arch_sweep, "run_child", lambda t, timeout: dict(type=t, verdict="WRONG", why="made up"))
    assert arch_sweep.main(["--types", "olmo"]) == 1
    assert "1 WRONG" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        arch_sweep.main(["--types", "no-such-type"])


@pytest.mark.slow
def test_no_swept_type_decodes_wrong(tmp_path):
    """Every type: exact, refused, or no verdict (it does not build small, or generate fails on it)."""
    out = tmp_path / "sweep.json"
    code = arch_sweep.main(["--json", str(out)])
    failing = [r for r in json.loads(out.read_text()) if r["verdict"] in arch_sweep.FAILING]
    assert code == 0 and not failing, failing

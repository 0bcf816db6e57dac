"""oneDNN linears on the CPU (lp.models.use_onednn_linears): the same products as F.linear at every
row count, every Linear swapped, greedy decoding on the swapped model still its own generate's
output, other dtypes and a failed check left on the stock kernels, the job config's choice."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.jobs.config import ConfigError, load_config_dict
from lp.models import ModelLoadError, OneDNNLinear, load_model, use_onednn_linears

TINY = "tiny-random-llama?vocab=64&layers=2&seed=3"
PROMPTS = ["def add(a, b):\n    return", "abc abc abc abc", "Once upon a time"]


def linears(model, kind):
    return [m for m in model.modules() if type(m) is kind]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_is_f_linear_at_every_row_count(dtype, tol, bias):
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(48, 80, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(80, 48, generator=gen))
        if bias:
            lin.bias.copy_(torch.randn(80, generator=gen))
    lin = lin.to(dtype)
    try:
        fast = OneDNNLinear(lin)
    except RuntimeError as e:      # e.g. bf16 packing needs avx512bw/vl/dq or avx_ne_convert; load_model then keeps
        if dtype is torch.float32:  # the stock kernels (checked below)
            raise
        model = torch.nn.Sequential(lin)        # here the runtime must keep the stock kernel instead
        assert not use_onednn_linears(model) and model[0] is lin, f"packing {dtype} raised {e} but was applied"
        return
    for rows in (1, 2, 5, 16, 40, 100):
        x = torch.randn(1, rows, 48, generator=gen).to(dtype)
        with torch.no_grad():
            got, want = fast(x), F.linear(x, lin.weight, lin.bias)
        assert got.shape == want.shape == (1, rows, 80) and got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max()))


def test_load_model_swaps_every_linear_and_keeps_the_logits():
    stock = load_model(TINY, device="cpu")
    fast = load_model(TINY, device="cpu", cpu_linear="onednn")
    assert (stock.linear_kernels, fast.linear_kernels) == ("torch", "onednn")
    n = len(linears(stock.model, torch.nn.Linear))
    assert n == 2 * 7 + 1                            # q k v o gate up down per layer, and the head
    assert len(linears(fast.model, OneDNNLinear)) == n and not linears(fast.model, torch.nn.Linear)
    x = torch.tensor([fast.tokenizer.encode(PROMPTS[0])])
    with torch.no_grad():
        torch.testing.assert_close(fast.model(x).logits, stock.model(x).logits, rtol=1e-4, atol=1e-4)


def greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("params", [
    LookaheadParams(0, 4, 0, suffix_factor=8, suffix_tokens=16),          # token trees, no window
    LookaheadParams(4, 3, 4, lookup_candidates=2, lookup_tokens=8, lookup_ngram=2),
], ids=["suffix-tree", "window-lookup"])
def test_greedy_lookahead_on_the_swapped_model_is_its_own_generate(params):
    """float32 rounds of several rows on oneDNN's kernels decode what one-row generate decodes."""
    fast = load_model(TINY, device="cpu", cpu_linear="onednn")
    assert fast.linear_kernels == "onednn"
    for prompt in PROMPTS:
        ids = fast.tokenizer.encode(prompt)
        r = lookahead_generate(fast.model, ids, params, GenerationParams(40), eos_token_ids=[])
        assert r.token_ids == greedy(fast.model, ids, 40)
        assert r.forwards < 40                        # the rounds did carry several rows


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_other_dtypes_keep_the_stock_linears(dtype):
    m = load_model(TINY, dtype=dtype, device="cpu", cpu_linear="onednn")
    assert m.linear_kernels == "torch" and not linears(m.model, OneDNNLinear)
    assert len(linears(m.model, torch.nn.Linear)) == 15


def test_a_swap_that_does_not_check_out_leaves_the_model_alone(monkeypatch):
    m = load_model(TINY, device="cpu")
    monkeypatch.setattr(OneDNNLinear, "forward", lambda self, x: torch.zeros(*x.shape[:-1], self.out_features))
    assert use_onednn_linears(m.model) is False
    assert len(linears(m.model, torch.nn.Linear)) == 15 and not linears(m.model, OneDNNLinear)


def test_a_torch_without_onednn_linear_ops_keeps_the_stock_linears(monkeypatch, caplog):
    m = load_model(TINY, device="cpu")

    def missing(self, linear):
        raise RuntimeError("mkldnn::_linear_pointwise is not available in this build")
    monkeypatch.setattr(OneDNNLinear, "__init__", missing)
    assert use_onednn_linears(m.model) is False
    assert len(linears(m.model, torch.nn.Linear)) == 15 and not linears(m.model, OneDNNLinear)
    assert "oneDNN's packed linear is not available (RuntimeError" in caplog.text


def test_bad_cpu_linear_is_refused():
    with pytest.raises(ModelLoadError, match="cpu_linear 'mkl'"):
        load_model(TINY, device="cpu", cpu_linear="mkl")


@pytest.mark.parametrize("model,kernels", [
    ({}, "onednn"),                                           # auto, eager rounds
    ({"compile": "default"}, "torch"),                        # auto, compiled rounds: inductor packs its own
    ({"cpu_linear": "torch"}, "torch"),
    ({"cpu_linear": "onednn"}, "onednn"),
    ({"cpu_linear": "torch", "compile": "default"}, "torch"),
])
def test_job_config_picks_the_kernels(model, kernels):
    assert load_config_dict({"model": model}).model.linear_kernels() == kernels


def test_onednn_cannot_be_compiled():
    with pytest.raises(ConfigError, match="model.cpu_linear: 'onednn' cannot be compiled"):
        load_config_dict({"model": {"cpu_linear": "onednn", "compile": "default"}})


def test_bench_kernels_times_both_kernels(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "kernels.json"
    cmd = [sys.executable, str(root / "scripts" / "bench_kernels.py"), "--model", TINY, "--rows", "3,1",
           "--prefix", "8", "--repeats", "1", "--threads", "1", "--json-out", str(out)]
    proc = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["rows"] for r in rows] == [1, 3]
    assert rows[0]["torch_vs_torch1"] == rows[0]["onednn_vs_onednn1"] == 1
    assert all(r["torch_ms"] > 0 and r["onednn_ms"] > 0 for r in rows)
    bad = subprocess.run(cmd[:2] + ["--rows", "0"], env=dict(os.environ, PYTHONPATH=str(root)),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--rows" in bad.stderr
    for args, needle in ((["--repeats", "0"], "--repeats"), (["--prefix", "-5"], "--prefix"),
                         (["--threads", "-1"], "--threads"), (["--model", "nonexistent"], "--model")):
        bad = subprocess.run(cmd[:2] + args, env=dict(os.environ, PYTHONPATH=str(root)),
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and needle in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)

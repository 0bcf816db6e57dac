"""One prepared device check: forward time against rows per round, and lookahead vs
autoregressive decode throughput of the runtime, on random-weight Llamas built on the
device (no download, no gguf, no embedded model file). Writes one JSON file.

    PYTHONPATH=. python scripts/gpu_check.py --out gpu_check.json          # on one CUDA GPU
    PYTHONPATH=. python scripts/gpu_check.py --small --out check.json      # tiny shapes, CPU (tests)

S is meaningless on random weights; time per round, the forward-time curve and host
overhead are not. Shapes: a 7B Llama (bf16) and the embedded SmolLM2-135M's shape.
"""
from __future__ import annotations

import json
import time

import click
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lp.baseline import autoregressive_generate
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.measure.cost_model import forward_curve, sync  # the one forward-time measurement (also the sweep's)

SHAPES = {
    "llama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152),
}
SMALL = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256)}


def build(shape: dict, dtype: torch.dtype, device: torch.device):
    config = LlamaConfig(**shape, max_position_embeddings=4096, attn_implementation="sdpa", eos_token_id=None,
                         bos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def decode_throughput(model, prompt_len: int, new_tokens: int, configs, device) -> dict:
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    gen = GenerationParams(new_tokens)
    sync(device)
    ar = autoregressive_generate(model, prompt, gen, eos_token_ids=[])
    report = {"autoregressive": {"tokens": ar.new_tokens, "seconds": ar.decode_seconds,
                                 "tokens_per_s": ar.new_tokens / ar.decode_seconds}}
    for w, n, g in configs:
        r = lookahead_generate(model, prompt, LookaheadParams(w, n, g), gen)
        report[f"lookahead {w},{n},{g}"] = {
            "tokens": r.new_tokens, "rounds": r.forwards, "S": r.compression, "seconds": r.decode_seconds,
            "tokens_per_s": r.new_tokens / r.decode_seconds,
            "ms_per_round": 1000 * r.decode_seconds / r.forwards,
            "host_ms_per_round": 1000 * r.host_seconds / r.forwards,
            "rows_per_round": sum(r.rows_per_round) / r.forwards,
            "same_as_autoregressive": r.token_ids == ar.token_ids,
        }
    return report


@click.command()
@click.option("--out", "out_path", default="gpu_check.json", show_default=True)
@click.option("--small", is_flag=True, help="tiny shapes and few rows: a CPU smoke run for the tests")
@click.option("--device", default="auto", show_default=True)
def main(out_path, small, device):
    device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                          ("cpu" if device == "auto" else device))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = SMALL if small else SHAPES
    rows_list = [1, 2, 4, 8, 16] if small else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    prefix, repeats = (32, 2) if small else (512, 5)
    configs = [(4, 4, 4)] if small else [(15, 5, 15), (7, 5, 7)]
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype), "torch": torch.__version__, "models": {}}
    start = time.perf_counter()
    for name, shape in shapes.items():
        model = build(shape, dtype, device)
        entry = {"forward_curve": forward_curve(model, prefix, rows_list, repeats, device),
                 "decode": decode_throughput(model, 16 if small else 128, 16 if small else 128, configs, device)}
        report["models"][name] = entry
        click.echo(f"{name}: " + ", ".join(f"{p['rows']} rows {1000 * p['seconds']:.2f} ms"
                                           for p in entry["forward_curve"]))
        for k, v in entry["decode"].items():
            click.echo(f"  {k}: {v['tokens_per_s']:.1f} tok/s" +
                       (f", {v['ms_per_round']:.2f} ms/round, host {v['host_ms_per_round']:.2f} ms"
                        if "ms_per_round" in v else ""))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["seconds"] = time.perf_counter() - start
    with open(out_path, "w") as f:
        json.dump(report, f, indent=2)
    click.echo(f"wrote {out_path} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()

"""lp: exact Lookahead Decoding and Lookahead Parallelism for Hugging Face transformers models.

The public surface (everything else is internal):

- `lookahead`: a `custom_generate` callable, `model.generate(ids, custom_generate=lp.lookahead, ...)`;
- `generate(model, prompts, tokenizer=..., ...)`: one or many prompts, stop strings, a streamer;
- `run_job(config)`: a YAML-configured job (`load_config(path)` makes the `JobConfig`), as `python -m lp.run`;
- `GenerationResult`: what `generate` returns per prompt.
"""
from __future__ import annotations

__all__ = ["GenerationResult", "JobConfig", "generate", "load_config", "lookahead", "run_job"]

_HOMES = {"lookahead": "lp.library", "generate": "lp.library", "GenerationResult": "lp.engine",
          "run_job": "lp.jobs.runner", "load_config": "lp.jobs.config", "JobConfig": "lp.jobs.config"}


def __getattr__(name: str):
    """Import on first use: `import lp.models` (or the command line) does not pay for the library."""
    if name in _HOMES:
        import importlib

        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lp' has no attribute {name!r}")

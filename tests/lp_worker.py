"""A torchrun worker for the LP tests: decodes the cases of a JSON spec with the
real process group (on its "model", or on the "models" its cases name: lp.tiny families too) and writes what it saw to <out>/rank<r>.json: per case the
tokens, the collectives it issued, the rows it fed per round and, per round,
the shard plan the engine followed (recorded by wrapping lp.engine's
shard_plan, so a test can hold the rows fed to the plan). A case with "batch" and "prompts" decodes
its prompts through decode_batch instead and records each request's tokens and per-round counts.

    torchrun --nproc 3 tests/lp_worker.py SPEC.json OUT_DIR
"""
import json
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

import lp.engine
from lp.decode.device import Uploader
from lp.decode.propose import SUFFIX_NGRAM
from lp.decode.suffix import SuffixIndex
from lp.parallel.dist import init_distributed, shutdown
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from lp.models import TinyTokenizer, tiny_random_llama
from lp.tiny import tiny_random
from sync_count import HostWaits, ours

COLLECTIVES = [
    "broadcast", "all_gather_into_tensor", "all_gather_single", "all_gather", "all_reduce", "reduce", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
    "send", "recv", "isend", "irecv", "broadcast_object_list", "all_gather_object",
    "gather_object", "scatter_object_list", "send_object_list", "recv_object_list",
]
calls = Counter()


def count_collectives():
    """Wrap every torch.distributed collective so each call is counted."""
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def wrapped(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)
        setattr(dist, name, wrapped)


plans = []   # one entry per round: the plan the engine used, and what one worker would feed


def shares(plan):
    return [[sh.rows, sh.subtrees.start, sh.subtrees.stop] for sh in plan]


def record_plans():
    """Wrap the engine's shard_plan (once per round): each rank's planned share, and the
    rows one worker would feed for the same round."""
    plan_fn = lp.engine.shard_plan

    def planned(world, columns, depth, units, ordinary=1):
        plan = plan_fn(world, columns, depth, units, ordinary)
        plans.append(dict(plan=shares(plan), subtrees=len(units), columns=columns,
                          whole=plan_fn(1, columns, depth, units, ordinary)[0].rows))
        return plan
    lp.engine.shard_plan = planned


def params(case) -> LookaheadParams:
    """A case's lookahead settings: W, N, G plus optional other keys (lookup, suffix drafts...)."""
    return LookaheadParams(case["w"], case["n"], case["g"], **case.get("lookup", {}))


def corpus(case):
    """A case's job-wide index of earlier completions (`corpus`: a list of token lists), or None."""
    if "corpus" not in case:
        return None
    index = SuffixIndex(SUFFIX_NGRAM)
    for seq in case["corpus"]:
        index.add(seq)
    return index


def count_uploads():
    """Wrap Uploader.send (one host-to-device copy each) so each call is counted."""
    send = Uploader.send

    def counted(self, sections):
        calls["upload"] += 1
        return send(self, sections)
    Uploader.send = counted


def float64_model(model_spec):
    """(model, tokenizer) in float64: a tiny Llama spec, or {"family": ..., ...} for lp.tiny's families."""
    if "family" in model_spec:
        model = tiny_random(**model_spec, dtype=torch.float64, experts_implementation="eager")
        return model, TinyTokenizer(model.config.vocab_size)
    loaded = tiny_random_llama(**model_spec)
    return loaded.model.double(), loaded.tokenizer


def main(spec_path, out_dir):
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    comm = init_distributed("gloo", timeout_s=60)
    models = {name: float64_model(m) for name, m in spec.get("models", {"": spec.get("model")}).items()}
    count_collectives()
    count_uploads()
    record_plans()
    results = []
    for case in spec["cases"]:
        model, tokenizer = models[case.get("model", "")]
        if "batch" in case:     # a batch of prompts through decode_batch: each request's tokens and rounds
            out = dict(lp.engine.decode_batch(
                model, [(i, p, i) for i, p in enumerate(case["prompts"])], params(case),
                GenerationParams(case["max_new"], **case.get("sampling", {})), batch_size=case["batch"], comm=comm,
                prompt_tokens=max(map(len, case["prompts"])), sampling_on_device=case.get("on_device")))
            results.append(dict(batch=[dict(tokens=out[i].token_ids, emitted=out[i].emitted_per_round)
                                       for i in range(len(case["prompts"]))]))
            continue
        before = Counter(calls)
        plans.clear()
        gen = GenerationParams(case["max_new"], stop=tuple(case.get("stop", ())), **case.get("sampling", {}))
        with HostWaits() as waits:
            r = lookahead_generate(model, case["prompt"], params(case), gen,
                                   eos_token_ids=case.get("eos", []), tokenizer=tokenizer, comm=comm,
                                   request=case.get("request", 0), corpus=corpus(case),
                                   sampling_on_device=case.get("on_device"))
        done = calls - before
        results.append(dict(tokens=r.token_ids, emitted=r.emitted_per_round, finish=r.finish_reason,
                            text=r.text, forwards=r.forwards, calls={k: v for k, v in done.items() if k != "upload"},
                            uploads=done["upload"], reads=dict(waits.reads), our_copies=ours(waits.uploads),
                            collectives=r.collectives, bytes=r.bytes_moved, rows=r.rows_per_round,
                            max_rows=r.max_rows_per_round, plans=list(plans)))
    Path(out_dir, f"rank{comm.rank}.json").write_text(json.dumps(dict(world=comm.world, results=results)))
    shutdown(comm)


if __name__ == "__main__":
    main(*sys.argv[1:])

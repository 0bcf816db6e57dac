"""A round makes the host wait for the device once (the gathered payload) and uploads once
(one packed buffer): counted on the CPU for greedy and sampling rounds, one worker (LP with two
workers: tests/test_lp.py)."""
import pytest
import torch
from conftest import own_completion_corpus

from lp.decode import device as device_module
from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
from sync_count import HostWaits, ours

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


@pytest.fixture(scope="module")
def corpus(model16):
    return own_completion_corpus(model16, PROMPT, 24)


@pytest.fixture
def uploads(monkeypatch):
    """Uploader.send calls (each is one host-to-device copy)."""
    calls = []
    send = device_module.Uploader.send

    def counted(self, sections):
        calls.append(sorted(sections))
        return send(self, sections)
    monkeypatch.setattr(device_module.Uploader, "send", counted)
    return calls


CASES = [
    ("greedy, window and lookup", LookaheadParams(4, 4, 4, lookup_candidates=2, lookup_tokens=6), GenerationParams(16)),
    ("greedy, suffix tree", LookaheadParams(0, 3, 0, suffix_factor=4, suffix_tokens=12, job_cache=True),
     GenerationParams(16)),
    ("sampling on the device", LookaheadParams(3, 4, 3, suffix_factor=4, suffix_tokens=8, job_cache=True),
     GenerationParams(16, temperature=0.5, top_k=8, top_p=0.95)),
]


@pytest.mark.parametrize("name,params,gen", CASES, ids=[c[0] for c in CASES])
def test_one_read_and_one_upload_per_round(model16, corpus, uploads, name, params, gen):
    with HostWaits() as waits:
        r = lookahead_generate(model16, PROMPT, params, gen, sampling_on_device=True,
                               corpus=corpus if params.job_cache else None)
    assert r.forwards > 3 and max(r.emitted_per_round) > 1
    reads = sum(waits.reads.values())
    assert reads == r.forwards, waits.reads                       # the payload, nothing else (model included)
    assert list(waits.reads) == [site for site in waits.reads if site.startswith("lp/engine.py")]
    assert len(uploads) == r.forwards                              # one packed buffer per round
    assert ours(waits.uploads) == 0, waits.uploads                 # no other copy from lp's code
    if gen.sampling:
        assert all("draws" in s for s in uploads)     # the walk's draws, in the one upload


@pytest.mark.parametrize("gen", [GenerationParams(24, repetition_penalty=1.3, min_new_tokens=12),
                                 GenerationParams(24, temperature=0.7, repetition_penalty=1.3, min_new_tokens=12)])
def test_the_processors_read_and_copy_nothing_more(model16, corpus, uploads, gen):
    """The repetition penalty's tokens and the EOS hold-back travel in the round's one upload; the
    processors read nothing back."""
    params = LookaheadParams(4, 4, 4, lookup_candidates=2, lookup_tokens=6)
    with HostWaits() as waits:
        r = lookahead_generate(model16, PROMPT, params, gen, sampling_on_device=True, eos_token_ids=[3])
    assert r.forwards > 3 and max(r.emitted_per_round) > 1
    assert sum(waits.reads.values()) == r.forwards, waits.reads
    assert len(uploads) == r.forwards and ours(waits.uploads) == 0, waits.uploads
    assert all("fresh" in s for s in uploads) and "hold" in uploads[0]


def test_the_counter_sees_what_it_must():
    """The counting mode itself: each kind of wait is seen (so the zeros above mean something)."""
    x = torch.arange(4)
    with HostWaits() as waits:
        x.tolist(), x[0].item(), bool(x[1]), int(x[2]), x[x[1]], x.to("cpu"), torch.tensor([1], device="cpu")
    assert sum(waits.reads.values()) == 5 and sum(waits.uploads.values()) == 2

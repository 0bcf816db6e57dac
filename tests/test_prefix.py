"""Prefix reuse in batched jobs (lp/decode/prefix.py): a joining prompt's prefill starts after the
longest prefix whose K/V a cache row holds (an active request's, what an ended request left, a
copy a moved request left behind), and in float64 every request still decodes exactly its own
`generate` ids; with `prefix_reuse: false` every prefill feeds its whole prompt."""
import dataclasses

import pytest

import lp.engine as engine
from lp.decode.prefix import RowPrefixes, common_prefix
from lp.engine import LookaheadParams
from lp.jobs.config import JOB_LOOKAHEAD
from test_architectures import models  # noqa: F401
from test_batch import CONFIGS, generate, run_batch

CHAT = [1, 17, 4, 9, 22, 5, 31, 8, 8, 2]      # a shared "template" every prompt starts with
TAILS = [[40, 3, 11, 5], [40, 3, 12], [7], [40, 3, 11, 5, 9, 9, 30], [19, 19, 4, 2, 6, 41, 3], [40], [12, 13]]
NEW = 24


PROMPTS = [CHAT + t for t in TAILS] + [CHAT[:6]]     # and a prompt that is another's prefix


def test_best_prefers_the_longest_then_the_joining_row_and_leaves_one_row_to_feed():
    rows = RowPrefixes(3)
    rows.left(0, [1, 2, 3, 4])
    rows.left(2, [1, 2, 9])
    assert rows.best([1, 2, 3, 7], 2, {1: [1, 2, 3]}) == (0, 3)      # row 0 and live row 1 tie: first found
    assert rows.held[2] == ()                                         # the joining row holds nothing now
    rows.left(2, [1, 2, 3])
    assert rows.best([1, 2, 3, 7], 2, {0: [1, 2, 3]}) == (2, 3)      # a tie: its own row, nothing to copy
    assert rows.best([1, 2, 3], 1, {0: [1, 2, 3, 4]}) == (0, 2)      # a whole-prompt match still feeds one row
    assert rows.best([8, 8], 1, {0: [1]}) == (1, 0)
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


@pytest.mark.parametrize("family", ["llama", "qwen2-swa", "deepseek-v3"])
def test_reused_prefixes_keep_every_request_its_own_generate(models, family, monkeypatch):
    """B = 3 over eight chat-like prompts, both configs: the joining row itself and another active
    request's row are reused (a free row and an earlier answer: the next tests), and every request's
    ids equal its own generate; without reuse the prefills feed whole prompts, with the same ids."""
    model = models(family)
    prompts = PROMPTS
    references = [generate(model, p, NEW) for p in prompts]
    sources = []
    best = RowPrefixes.best

    def recorded(self, prompt, row, live):
        source, slots = best(self, prompt, row, live)
        sources.append(("own" if source == row else "live" if source in live else "free", slots))
        return source, slots
    monkeypatch.setattr(engine.RowPrefixes, "best", recorded)
    for name, params in CONFIGS.items():
        sources.clear()
        out = run_batch(model, prompts, params, 3, NEW)
        for i, reference in enumerate(references):
            assert out[i].token_ids == reference, (family, name, i)
        assert {kind for kind, slots in sources if slots} >= {"own", "live"}, sources
        assert sum(slots for _, slots in sources) >= 5 + 10 * (len(prompts) - 2)      # CHAT at least, each join
        fed = prefill_rows(monkeypatch)
        off = run_batch(model, prompts, dataclasses.replace(params, prefix_reuse=False), 3, NEW)
        assert fed == list(map(len, prompts))
        monkeypatch.undo()
        monkeypatch.setattr(engine.RowPrefixes, "best", recorded)
        assert all(off[i].token_ids == reference for i, reference in enumerate(references))


def prefill_rows(monkeypatch) -> list[int]:
    """The prompt rows each prefill feeds from now on (its ordinary rows)."""
    fed = []
    run = engine.Rounds.run

    def recorded(self, states, stats):
        if len(states) == 1 and states[0].result.forwards == 0:
            fed.append(len(states[0].ordinary))
        return run(self, states, stats)
    monkeypatch.setattr(engine.Rounds, "run", recorded)
    return fed


def test_a_second_turn_reuses_an_earlier_answer(models, monkeypatch):
    """B = 2: a first prompt, a short request (its third token is the EOS), then a second turn of the
    first (its prompt, the start of its answer, a new message), which joins while the first still runs
    and reuses part of its answer."""
    model = models("llama")
    first = PROMPTS[0]
    answer = generate(model, first, NEW)
    short, eos = next((p, generate(model, p, NEW)[2]) for p in PROMPTS[1:] if generate(model, p, NEW)[2] not in answer)
    turn = first + answer[:16] + [3, 3]
    fed = prefill_rows(monkeypatch)
    out = run_batch(model, [first, short, turn], LookaheadParams(**JOB_LOOKAHEAD), 2, NEW, eos=[eos])
    assert out[1].finish_reason == "eos" and len(out[1].token_ids) == 3
    assert fed[:2] == [len(first), 1] and fed[2] < len(turn) - len(first)     # the answer's tokens were reused
    references = [generate(model, p, NEW, eos=eos) for p in (first, short, turn)]
    assert [out[i].token_ids for i in range(3)] == references


def test_a_second_turn_over_a_whole_ended_answer(models):
    """B = 2, no drafts: the first request and a short one end in the same round, then a second turn
    holding the first's whole answer joins. The free row holds K/V up to the answer's last token but
    one (the last was never fed): the turn feeds that token and its new message (3 rows), and reads no
    slot the ended request never wrote."""
    model = models("llama")
    first, short = PROMPTS[0], CHAT[:3] + [7]
    answer = generate(model, first, 12)
    turn = first + answer + [3, 3]
    out = run_batch(model, [first, short, turn], LookaheadParams(0, 3, 0), 2, 12)
    assert [out[i].token_ids for i in range(3)] == [generate(model, p, 12) for p in (first, short, turn)]
    assert out[2].rows_per_round[0] == 3


def test_a_free_row_left_by_an_ended_request_is_reused(models, monkeypatch):
    """Two tokens each, no drafts: three requests end in the same round, so the next prompt joins row 0
    with rows 1 and 2 free; it shares most with what row 2 holds, which is copied."""
    model = models("llama")
    prompts = [CHAT + [40], CHAT[:3] + [7], CHAT + TAILS[3], CHAT + TAILS[3] + [5], CHAT[:8] + [6]]
    joins = []
    best = RowPrefixes.best

    def recorded(self, prompt, row, live):
        joins.append((row, *best(self, prompt, row, live), sorted(live)))
        return joins[-1][1:3]
    monkeypatch.setattr(engine.RowPrefixes, "best", recorded)
    out = run_batch(model, prompts, LookaheadParams(0, 3, 0), 3, 2)
    assert joins[3] == (0, 2, len(CHAT + TAILS[3]), [])             # from free row 2 into row 0
    assert joins[4] == (1, 0, 8, [0])                                # from live row 0
    assert [r.rows_per_round[0] for _, r in sorted(out.items())] == [len(prompts[0]), 1, 6, 1, 1]   # no trees
    assert all(out[i].token_ids == generate(model, p, 2) for i, p in enumerate(prompts))


def test_batch_one_reuses_nothing(models, monkeypatch):
    """Batch 1 stays today's path: each prefill feeds its whole prompt (same forwards, same rows)."""
    model = models("llama")
    fed = prefill_rows(monkeypatch)
    out = run_batch(model, PROMPTS, LookaheadParams(**JOB_LOOKAHEAD), 1, NEW)
    assert fed == list(map(len, PROMPTS)) and len(out) == len(PROMPTS)

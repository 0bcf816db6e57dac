import pytest

from lp.decode.stopping import StopChecker


class CharTokenizer:
    """id -> one character: 'a' + id; id 0 decodes to a newline."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("\n" if i == 0 else chr(ord("a") + i) for i in ids)


def feed(checker, tokens):
    for i, t in enumerate(tokens):
        if checker.push(t):
            return i
    return None


def test_eos_ends_output_and_is_kept():
    c = StopChecker([9, 7], 100)
    assert feed(c, [1, 2, 7, 4]) == 2
    assert c.tokens == [1, 2, 7] and c.reason == "eos"


def test_max_new_tokens_exact():
    c = StopChecker([], 3)
    assert feed(c, [1, 2, 3, 4, 5]) == 2
    assert c.tokens == [1, 2, 3] and c.reason == "length"


def test_stop_string_across_token_boundaries_cuts_text():
    c = StopChecker([], 100, stop=["\ndef"], tokenizer=CharTokenizer())
    # "bc" then "\n" "d" "e" "f": the stop string spans four tokens
    assert feed(c, [1, 2, 0, 3, 4, 5, 6]) == 5
    assert c.reason == "stop"
    assert c.tokens == [1, 2, 0, 3, 4, 5]
    assert c.text == "bc"


def test_earliest_stop_string_wins():
    c = StopChecker([], 100, stop=["ef", "cd"], tokenizer=CharTokenizer())
    feed(c, [2, 3, 4, 5])           # "cdef": "cd" completes first
    assert c.text == "" and c.tokens == [2, 3]


def test_eos_beats_length_on_the_same_token():
    c = StopChecker([3], 3)
    feed(c, [1, 2, 3])
    assert c.reason == "eos"


def test_a_criterion_beats_length_on_the_same_token():
    c = StopChecker([], 3, criterion=lambda out: len(out) == 3)
    feed(c, [1, 2, 3])
    assert c.reason == "stop"


@pytest.mark.parametrize("stop", ["xy", "xyz", "vwxyz"])
def test_a_stop_string_ending_one_character_past_a_checkpoint(stop):
    """All but the last character of the stop string lie before the first checkpoint (SETTLE_TOKENS
    tokens, one character each): the search after it starts the stop string's length less one before
    the checkpoint's end."""
    from lp.decode.stopping import SETTLE_TOKENS

    before = SETTLE_TOKENS - len(stop) + 1
    c = StopChecker([], 200, stop=[stop], tokenizer=CharTokenizer())
    assert feed(c, [1] * before + [ord(ch) - ord("a") for ch in stop] + [1] * 10) == SETTLE_TOKENS
    assert c.reason == "stop" and c.text == "b" * before


class ByteTokenizer:
    """id -> one byte, decoded as UTF-8 with replacement: a character's bytes may come over several ids."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_a_stop_waits_for_a_character_split_over_tokens():
    """While an emoji's four bytes come one id at a time the text ends in U+FFFD; a stop matching that
    (generate's does not) would end the output on a character that is not there. Settled, it matches."""
    wave = list("🌊".encode())
    c = StopChecker([], 100, stop=["\ufffd"], tokenizer=ByteTokenizer())
    assert feed(c, wave + list(b"ab")) is None and c.text == "🌊ab"
    c = StopChecker([], 100, stop=["\ufffd"], tokenizer=ByteTokenizer())
    assert feed(c, wave + [0xFF] + list(b"ab")) == 5 and c.text == "🌊"       # 0xFF never completes
    c = StopChecker([], 100, stop=["🌊"], tokenizer=ByteTokenizer())
    assert feed(c, list(b"a") + wave + list(b"b")) == 4 and c.text == "a"


def test_stop_strings_need_a_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        StopChecker([], 5, stop=["x"])


def test_push_after_end_raises():
    c = StopChecker([], 1)
    c.push(1)
    with pytest.raises(RuntimeError):
        c.push(2)


# ---------------------------------------------------------------- a real BPE tokenizer, inside long rounds

# the model copies the quoted text from the prompt in one lookup round: ' done' is one token of five
# characters, and '✓' and '語' are each split over three byte tokens (none decodes to the character alone)
BPE_PROMPT = 'x = "✓ done — 日本語 ✓ done — 日本語"\ny = "✓ done — 日本語'
BPE_NEW = 16


def bpe_run(loaded, stop=(), **sampling):
    from lp.engine import GenerationParams, LookaheadParams, lookahead_generate
    from lp.jobs.config import JOB_LOOKAHEAD

    return lookahead_generate(loaded.model, loaded.tokenizer.encode(BPE_PROMPT), LookaheadParams(**JOB_LOOKAHEAD),
                              GenerationParams(BPE_NEW, stop=tuple(stop), **sampling),
                              eos_token_ids=loaded.eos_token_ids, tokenizer=loaded.tokenizer, request="bpe")


@pytest.fixture(scope="module")
def uncut(smollm2_f64):
    """The uncut run of BPE_PROMPT, greedy or sampled, computed once for every stop string."""
    runs = {}

    def get(sampling):
        key = tuple(sorted(sampling.items()))
        if key not in runs:
            runs[key] = bpe_run(smollm2_f64, **sampling)
        return runs[key]
    return get


def inside_a_long_round(full, end):
    """The token at index `end` lies inside a round of `full`, after its first token, before its last."""
    done = 0
    for e in full.emitted_per_round:
        if done < end < done + e - 1:
            return True
        done += e
    return False


# where the stop string ends: inside a multi-character token, or on the last byte token of a
# character split over several tokens
@pytest.mark.parametrize("stop,ends", [("on", "in a token"), ("本語", "on a split character")])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.5, "seed": 1}], ids=["greedy", "sampling"])
def test_bpe_stop_string_cut_inside_a_long_round(smollm2_f64, uncut, stop, ends, sampling):
    """The embedded model's BPE tokenizer: a stop string completed inside an accepted multi-token
    round, ending inside a multi-character token ('on' in ' done') or on the last byte token of a
    character split over three tokens, ends the output where the one-token-at-a-time reference (a
    StopChecker fed the uncut output token by token) does: the ids keep the completing token, the
    text is cut right before the stop string. Greedy, generate's own decoding with the same stop
    string is the reference too."""
    from lp.baseline import autoregressive_generate
    from lp.engine import GenerationParams

    loaded, tok = smollm2_f64, smollm2_f64.tokenizer
    full = uncut(sampling)
    ref = StopChecker(loaded.eos_token_ids, BPE_NEW, (stop,), tok)
    feed(ref, full.token_ids)
    assert ref.reason == "stop"
    end = len(ref.tokens) - 1                       # the token that completes the stop string
    assert inside_a_long_round(full, end), full.emitted_per_round
    upto = tok.decode(full.token_ids[:end + 1])
    if ends == "in a token":                        # the token goes on past the stop string
        assert upto.index(stop) + len(stop) < len(upto)
    else:                                           # a byte piece: the character needs the tokens before it
        assert tok.decode([full.token_ids[end]]) == "\ufffd" and upto.endswith(stop)
    text = tok.decode(full.token_ids, skip_special_tokens=True)
    assert ref.text == text[:text.index(stop)]

    cut = bpe_run(loaded, [stop], **sampling)
    assert cut.finish_reason == "stop"
    assert cut.token_ids == ref.tokens == full.token_ids[:end + 1] and cut.text == ref.text
    if not sampling:
        ids = tok.encode(BPE_PROMPT)
        plain = autoregressive_generate(loaded.model, ids, GenerationParams(BPE_NEW, stop=(stop,)),
                                        eos_token_ids=loaded.eos_token_ids, tokenizer=tok)
        assert plain.token_ids == cut.token_ids and plain.text == cut.text and plain.finish_reason == "stop"


# ---------------------------------------------------------------- a decoder that strips the start of a text

def llama_style_tokenizer():
    """A small tokenizer of CodeLlama's class (SentencePiece-style pieces, '▁' for a space) built here: its
    decoder strips one space from the start of a text, as Llama's and CodeLlama's do."""
    from transformers import CodeLlamaTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "▁▁": 4, "▁▁▁": 5, "▁▁▁▁": 6, "r": 7, "e": 8, "t": 9,
             "u": 10, "n": 11, "▁return": 12, "▁x": 13, "<0x0A>": 14, "x": 15, "re": 16, "ret": 17, "retu": 18,
             "retur": 19, "return": 20, "▁r": 21}
    merges = [("▁", "▁"), ("▁▁", "▁"), ("▁▁", "▁▁"), ("r", "e"), ("re", "t"), ("ret", "u"), ("retu", "r"),
              ("retur", "n"), ("▁", "r"), ("▁", "return"), ("▁", "x")]
    return CodeLlamaTokenizer(vocab=vocab, merges=merges)


def after_prompt(tokenizer, prompt, new):
    """The text `new` adds after `prompt`: the whole decoded, less the prompt decoded."""
    whole = tokenizer.decode(list(prompt) + list(new), skip_special_tokens=True)
    return whole[len(tokenizer.decode(list(prompt), skip_special_tokens=True)):]


def test_text_keeps_the_first_space_a_stripping_decoder_drops():
    """A completion's first indent: '▁▁▁▁' 'return' '▁x' after a prompt ending in a newline is the line
    '    return x'; decoded alone it lost a space ('   return x', an IndentationError after a HumanEval
    prompt), and a stop string on the indent did not match."""
    tok = llama_style_tokenizer()
    prompt, new = tok.encode('def f(x):\n    """doc"""\n'), [6, 20, 13]
    assert tok.decode(new, skip_special_tokens=True) == "   return x"        # the decoder strips a space
    checker = StopChecker([2], 16, tokenizer=tok, context=prompt)
    feed(checker, new)
    assert checker.text == after_prompt(tok, prompt, new) == "    return x"
    stopped = StopChecker([2], 16, ["    return"], tok, context=prompt)
    assert feed(stopped, new) == 1 and stopped.text == ""
    # a prompt that ends in more special tokens than the tail decodes: it reaches back to text
    specials = tok.encode("a\n") + [2] * 9
    checker = StopChecker([], 16, tokenizer=tok, context=specials)
    feed(checker, new)
    assert checker.text == after_prompt(tok, specials, new) == "    return x"


def test_lp_generate_text_is_the_text_after_the_prompt(tiny_model64):
    """lp.generate's text and a job's response: the first new token an indent, under the stripping decoder."""
    import lp

    tok = llama_style_tokenizer()

    def allowed(batch_id, ids):
        return [6] if ids.shape[-1] == len(prompt) else list(range(3, 22))

    for prompt in (tok.encode("def f(x):\n"), tok.encode("def f(x):\n") + [2] * 9):    # 9: past the tail of 8
        (result,) = lp.generate(tiny_model64, prompt, tokenizer=tok, max_new_tokens=6, eos_token_id=[],
                                prefix_allowed_tokens_fn=allowed)
        assert result.token_ids[0] == 6 and result.text.startswith("    ")
        assert result.text == after_prompt(tok, prompt, result.token_ids)


# ---------------------------------------------------------------- long outputs: decoded from a checkpoint

def wordpiece_tokenizer():
    """A WordPiece tokenizer that tidies spaces across tokens ('a' '.' -> 'a.', 'a' "'" 's' -> "a's", '##'
    joins): text changes behind the newest token, which a checkpoint must notice."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[SEP]", "a", "b", "##b", "##c", ".", "'", "s", "do", "n't", "\n", "x", "=", "1"]
    core = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(cleanup=True)
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", sep_token="[SEP]",
                                   clean_up_tokenization_spaces=True)


def whole_decode_reference(tokenizer, context, stop, tokens):
    """What the checker must give, found the plain way: the whole output decoded after every token."""
    from lp.decode.stopping import continuation_text, text_context

    ctx, before = text_context(tokenizer, context)
    for n in range(1, len(tokens) + 1):
        text = continuation_text(tokenizer, ctx, tokens[:n], before)
        settled = len(text.rstrip("\ufffd"))
        hits = [i for i, s in ((text.find(s), s) for s in stop) if 0 <= i and i + len(s) <= settled]
        if hits:
            return n, text[:min(hits)]
    return None, continuation_text(tokenizer, ctx, tokens, before)


class CountingTokenizer:
    """A tokenizer that counts the ids it is asked to decode."""

    def __init__(self, inner):
        self.inner, self.decoded = inner, 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("kind", ["bytes", "stripping", "wordpiece", "bpe"])
def test_long_output_stops_where_a_whole_decode_does(kind, request):
    """Random outputs of 150-400 tokens (special tokens, characters split over byte tokens, seams the
    decoder tidies) under each kind of decoder: the checker ends at the same token, with the same text, as
    the whole output decoded after every token."""
    import random

    from lp.decode.stopping import SETTLE_TOKENS

    if kind == "bytes":
        tok, pool = ByteTokenizer(), list(b"ab \n=") + list("✓語".encode()) + [0xFF]
    elif kind == "stripping":
        tok = llama_style_tokenizer()
        pool = list(range(22))
    elif kind == "wordpiece":
        tok = wordpiece_tokenizer()
        pool = list(range(15))
    else:
        tok = request.getfixturevalue("smollm2_f64").tokenizer
        pool = tok.encode('x = "✓ done — 日本語"\n    return y\n') + [tok.eos_token_id, 1, 2]
    rng = random.Random(kind)
    for case in range(12):
        tokens = [rng.choice(pool) for _ in range(rng.randint(150, 400))]
        context = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        # a stop string drawn from the text far past the first checkpoint, or one that never shows
        full = whole_decode_reference(tok, context, (), tokens)[1]
        start = rng.randint(min(len(full) - 1, 2 * SETTLE_TOKENS), len(full) - 1)
        stop = (full[start:start + rng.randint(1, 4)] or "\x00", "\x01never") if case % 3 else ("\x01never",)
        end, text = whole_decode_reference(tok, context, stop, tokens)
        checker = StopChecker([], len(tokens), stop, tok, context=context)
        got = feed(checker, tokens)
        assert (got if got is None else got + 1) == end or end is None and got == len(tokens) - 1, (kind, case)
        assert checker.text == text, (kind, case)


def test_long_output_is_not_decoded_whole_at_every_token():
    """Decoding the whole output at every token costs O(n^2): 1.3 s for 4,096 tokens of SmolLM2. The
    checker decodes from a checkpoint: for 2,000 tokens, far fewer than n^2 / 2 ids."""
    tok = CountingTokenizer(ByteTokenizer())
    n = 2000
    checker = StopChecker([], n, ["\x01"], tok, context=list(b"def f():\n"))
    assert feed(checker, [ord("a") + i % 20 for i in range(n)]) == n - 1
    assert tok.decoded < n * n / 8, tok.decoded


def test_a_decoder_that_tidies_behind_the_seam_is_decoded_whole():
    """WordPiece's cleanup joins "'s" onto the word before it, across the checkpoint's seam: the seam's
    own text changes, so the checker decodes whole from then on, and stops where it should."""
    from lp.decode.stopping import SETTLE_TOKENS

    tok = wordpiece_tokenizer()
    words = {w: i for i, w in enumerate(["[UNK]", "[SEP]", "a", "b", "##b", "##c", ".", "'", "s", "do", "n't"])}
    tokens = [words["a"]] * (SETTLE_TOKENS - 1) + [words["'"], words["s"], words["do"], words["n't"], words["."],
                                                    words["b"], words["##c"]]
    assert tok.decode(tokens[SETTLE_TOKENS - 2:]) == "a's don't. bc"
    checker = StopChecker([], 200, ["'s don't. bc"], tok)
    assert feed(checker, tokens) == len(tokens) - 1
    assert checker._whole and checker.text == "a " * (SETTLE_TOKENS - 2) + "a"


class ShoutingTokenizer(CharTokenizer):
    """CharTokenizer, but everything after a '!' (id 32) is upper case: a token's text depends on one far
    back, which the few tokens before a checkpoint's seam do not show."""

    def decode(self, ids, skip_special_tokens=True):
        text = "".join("!" if i == 32 else chr(ord("a") + i) for i in ids)
        head, bang, tail = text.partition("!")
        return head + bang + tail.upper()


def test_a_decoder_that_changes_text_far_behind_is_decoded_whole():
    """The checkpoint's whole decode differs from the text decoded after its seam: from then on the
    checker decodes whole, and a stop string past that point ends the output where a whole decode does."""
    from lp.decode.stopping import SETTLE_TOKENS

    tok = ShoutingTokenizer()
    tokens = [1] * 5 + [32] + [1] * (3 * SETTLE_TOKENS) + [23, 24, 25] + [1] * 5       # ... '!' ... 'XYZ'
    checker = StopChecker([], 1000, ["XYZ"], tok)
    assert feed(checker, tokens) == 6 + 3 * SETTLE_TOKENS + 2
    assert checker._whole and checker.text == "bbbbb!" + "B" * (3 * SETTLE_TOKENS)
    counting = CountingTokenizer(tok)     # the check that finds the texts differ decodes the output whole once
    checker = StopChecker([], 1000, ["XYZ"], counting)
    feed(checker, tokens[:2 * SETTLE_TOKENS - 1])
    before = counting.decoded
    checker.push(tokens[2 * SETTLE_TOKENS - 1])
    assert checker._whole and counting.decoded - before < 2 * (2 * SETTLE_TOKENS), counting.decoded - before


def test_a_checkpoint_after_an_output_of_special_tokens_keeps_the_next_space():
    """The checkpoint's seam was the output's own last tokens: after 64 special tokens (no text) a
    stripping decoder dropped the first space of what followed, and a stop string on the indent never
    matched. The seam reaches into the prompt's text now."""
    from lp.decode.stopping import SETTLE_TOKENS

    tok = llama_style_tokenizer()
    prompt = tok.encode("def f(x):\n")
    tokens = [1] * SETTLE_TOKENS + [6, 20, 13] + [15] * 10          # <s> x 64, '    return x', 'x' x 10
    end, text = whole_decode_reference(tok, prompt, ("    return",), tokens)
    checker = StopChecker([], len(tokens), ["    return"], tok, context=prompt)
    assert feed(checker, tokens) + 1 == end == SETTLE_TOKENS + 2 and checker.text == text == ""

"""When a request ends: EOS ids, max_new_tokens, stop strings on decoded text, a caller's test."""
from __future__ import annotations

from typing import Any, Callable, Sequence

# a caller's stopping test: (request key, its input as generate's criteria see it: seen prompt + output) -> stop
StopTest = Callable[[Any, list[int]], bool]

CONTEXT_TOKENS = 8      # the prompt's last tokens decoded before the output (continuation_text), at least
SETTLE_TOKENS = 64      # a StopChecker decodes the output anew from its last checkpoint, one every so many tokens


def text_context(tokenizer, prompt: Sequence[int]) -> tuple[list[int], str]:
    """The prompt's tail that continuation_text decodes before the output, and its text: the last
    CONTEXT_TOKENS ids, doubled while they decode to nothing (special tokens only, which the text leaves
    out and a stripping decoder would strip past)."""
    prompt, count = list(prompt), CONTEXT_TOKENS
    while True:
        context = prompt[-count:]
        text = tokenizer.decode(context, skip_special_tokens=True) if context else ""
        if text or count >= len(prompt):
            return context, text
        count *= 2


def continuation_text(tokenizer, context: Sequence[int], tokens: Sequence[int], before: str | None = None,
                      seam_kept: bool = False) -> str | None:
    """The text `tokens` add after a prompt ending in `context` (text_context: the ids and `before`, their
    text): decode(context + tokens) less decode(context) (special tokens left out), as
    `decode(prompt + output)[len(decode(prompt)):]` gives it. Decoded alone, the output's first space is
    lost by tokenizers whose decoder strips the start of a text (Llama's and CodeLlama's SentencePiece
    ones: a completion's first indent would be one space short). Where the context's text is not a
    prefix of the whole (a tokenizer that tidies spaces across the seam; a character split over the seam,
    which a prompt encoded from text never ends in), the output is decoded alone; or, with `seam_kept`,
    None is returned."""
    if context:
        before = tokenizer.decode(list(context), skip_special_tokens=True) if before is None else before
        whole = tokenizer.decode(list(context) + list(tokens), skip_special_tokens=True)
        if whole.startswith(before):
            return whole[len(before):]
        if seam_kept:
            return None
    return tokenizer.decode(list(tokens), skip_special_tokens=True)


class StopChecker:
    """Feed generated tokens one at a time; `push` returns the finish reason
    ("eos", "length", "stop") at the token that ends the output, else None.

    EOS: the output ends at (and includes) the EOS token, like `generate`.
    Length: exactly `max_new_tokens` tokens, never one more.
    Stop strings: matched on the decoded text of all generated tokens (continuation_text after `context`,
    the prompt's ids), so a stop string may span token boundaries; the ids keep the token that
    completed the match and `text` is cut right before the stop string. A match that reaches into the
    U+FFFD that end the text waits for the next token: they may be a character split over tokens, whose
    later bytes replace them (a real U+FFFD at the end is matched one token later).
    The text is not decoded whole at every token, which costs O(length) a token (1.3 s for 4,096 tokens
    of SmolLM2): the tokens since the last checkpoint are decoded after the ones before it (its seam),
    as the output is after the prompt, and the checkpoint moves every SETTLE_TOKENS tokens. A whole
    decode checks the text so made at 2, 4, 8, ... times SETTLE_TOKENS tokens (so O(length) in all).
    Where the seam's text changes (a decoder that tidies spaces across tokens) the checker decodes whole
    from then on. So it does where a check finds the two texts differ: a decoder whose text depends on
    tokens further back than the seam's CONTEXT_TOKENS, which no Hugging Face decoder (byte-level,
    SentencePiece, WordPiece) does; for such a decoder a stop string before that check may end the
    output late (at the check), its text still cut at the stop string. Only the text from the
    checkpoint (less a stop string's length) is searched: what lies before it was searched already.
    A caller's `criterion` (the generate drop-in's stopping criteria) sees the output after each token
    and ends it at that token ("stop") when it returns True.
    """

    def __init__(self, eos_token_ids: Sequence[int], max_new_tokens: int,
                 stop: Sequence[str] = (), tokenizer=None, criterion: Callable[[list[int]], bool] | None = None,
                 context: Sequence[int] = ()):
        if stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the output")
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.eos = frozenset(eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.stop = tuple(stop)
        self._longest = max(map(len, self.stop), default=0)
        self.tokenizer = tokenizer
        self.criterion = criterion
        self.context, self._before = (text_context(tokenizer, [int(t) for t in context]) if tokenizer is not None
                                      else ([], ""))
        self.tokens: list[int] = []
        self.reason: str | None = None
        self._cut: int | None = None
        # the checkpoint: tokens[:_mark] decode to _settled (checked whole); _seam, _seam_text: their tail
        self._mark, self._settled, self._seam, self._seam_text = 0, "", self.context, self._before
        self._whole = False     # decode whole at every token (a decoder the checkpoint does not hold for)
        self._check_at = 2 * SETTLE_TOKENS      # the next checkpoint that a whole decode checks

    def push(self, token: int) -> str | None:
        if self.reason is not None:
            raise RuntimeError("push after the output has ended")
        self.tokens.append(token)
        if token in self.eos:
            self.reason = "eos"
        elif self.stop and self._find_stop() is not None:
            self.reason = "stop"
        elif self.criterion is not None and self.criterion(self.tokens):
            self.reason = "stop"
        elif len(self.tokens) >= self.max_new_tokens:
            self.reason = "length"
        return self.reason

    def _decode(self) -> str:
        return continuation_text(self.tokenizer, self.context, self.tokens, self._before)

    def _text_parts(self) -> tuple[str, str]:
        """The output's text, as _decode gives it, as (head, tail): the checkpoint's text and what the
        tokens since add, decoded after its seam (see the class); or (the whole text, "")."""
        if self._whole or not self._mark and len(self.tokens) < SETTLE_TOKENS:
            return self._decode(), ""
        if len(self.tokens) - self._mark >= SETTLE_TOKENS:
            return self._checkpoint(), ""
        tail = self._tail()
        if tail is None:            # the seam's own text changed: a decoder that tidies across tokens
            self._whole = True
            return self._decode(), ""
        return self._settled, tail

    def _tail(self) -> str | None:
        """The text of the tokens since the checkpoint, decoded after its seam; None if the seam's changes."""
        return continuation_text(self.tokenizer, self._seam, self.tokens[self._mark:], self._seam_text, seam_kept=True)

    def _checkpoint(self) -> str:
        """The text so far, the checkpoint moved to its end. The first is decoded whole, and so are those
        at 2, 4, 8, ... times SETTLE_TOKENS tokens, to check the text decoded after the seams (a whole
        decode at every checkpoint cost O(length) every SETTLE_TOKENS tokens)."""
        if not self._mark:
            text = self._decode()
        else:
            tail = self._tail()
            if tail is None:                # the seam's own text changed
                self._whole = True
                return self._decode()
            text = self._settled + tail
            if len(self.tokens) >= self._check_at:
                self._check_at *= 2
                whole = self._decode()
                if whole != text:           # a decoder whose text reaches further back than the seam
                    self._whole = True
                    return whole
        if not text.endswith("\ufffd"):         # not inside a character split over tokens
            self._mark, self._settled = len(self.tokens), text
            # the seam reaches into the prompt where the output so far has no text (special tokens):
            # without text before it, a stripping decoder drops the next token's first space
            self._seam, self._seam_text = text_context(self.tokenizer, [*self.context, *self.tokens])
        return text

    def _find_stop(self) -> int | None:
        checked = len(self._settled)        # the checkpoint's text: the same after this token, searched before
        head, tail = self._text_parts()
        # so a new match ends past it: the text searched starts a stop string short of it (at 0 where the
        # text is decoded whole), without copying the output's text at every token
        start = 0 if self._whole else max(0, checked - self._longest + 1)
        text = head[start:] + tail
        # trailing U+FFFD may be a character whose bytes are still to come: a match reaching into it waits
        settled = len(text.rstrip("\ufffd"))
        hits = [i for i, s in ((text.find(s), s) for s in self.stop) if 0 <= i and i + len(s) <= settled]
        if hits:
            self._cut = start + min(hits)
        return self._cut

    @property
    def text(self) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._decode()
        return text if self._cut is None else text[:self._cut]

"""Chat code completion for instruct models: the instruction around a code prompt, where the answer
stops, and the code taken out of the answer.

An instruct model given a raw code prompt tends to close the code block it believes it is in and
go on in prose. In the chat mode (`data.chat_template: true`) the prompt goes, in a fenced block,
into an instruction (`data.instruction`, `{prompt}` marks the place) sent as the user message of
the tokenizer's chat template, and the assistant's answer is opened with `data.response_prefix`
(an opening fence by default, so the answer starts inside the code block). Decoding stops at the
closing fence: CHAT_CODE_STOP is "\\n```", a fence at the start of a line. A bare "```" would also
hit an answer that opens its own fence at its very start; the default prefix "```python" leaves
the newline after the language tag to the model, so even an empty block ends in "\\n```".

The record keeps the whole answer (`response`: the prefix, then the decoded output, cut before the
stop string) and the code that is evaluated (`completion`): the first fenced block of the answer
(to its closing fence, or to the end when the fence is not closed, as after the stop), or the whole
answer when it has no fence, preceded by the prompt's import lines that it lacks.
"""
from __future__ import annotations

import ast
import re
import warnings

CODE_INSTRUCTION = "Complete the body of the following Python code:\n```python\n{prompt}\n```"
RESPONSE_PREFIX = "```python"
CHAT_CODE_STOP = ("\n```",)

# a fence line as Markdown (CommonMark) reads one: at most 3 spaces before it (an indented ``` line, such as
# one in a docstring's example, is code, not the block's end)
_OPENING = re.compile(r"^ {0,3}(```+)[^`\n]*$", re.M)   # 3 or more backticks, an optional language tag


def _closing(ticks: int) -> re.Pattern:
    """The line that closes a block opened with `ticks` backticks: at least as many, nothing after them
    but spaces (and a CRLF answer's \\r)."""
    return re.compile(rf"^ {{0,3}}`{{{ticks},}}[ \t]*\r?$", re.M)
_IMPORT = re.compile(r"^(?:import|from)[ \t]+\S")


def chat_message(prompt: str, instruction: str = CODE_INSTRUCTION) -> str:
    """The user message: the instruction with `{prompt}` replaced by the prompt (trailing blank lines
    dropped, so the closing fence sits right under the code)."""
    return instruction.replace("{prompt}", prompt.rstrip())


def extract_code(response: str) -> str:
    """The content of the answer's first fenced block (to its closing fence, or to the end of the
    answer when the fence is not closed), or the whole answer when it has no fence."""
    opening = _OPENING.search(response)
    if opening is None:
        return response
    start = min(opening.end() + 1, len(response))  # the line after the fence
    closing = _closing(len(opening.group(1))).search(response, start)
    return response[start:len(response) if closing is None else closing.start()].rstrip("\r\n")


def import_lines(code: str) -> list[str]:
    """The top-level import statements of `code` (the lines of each), in order: those of its syntax tree
    when it parses, else each column-0 line that is an import statement on its own (prose such as
    "from now on, be brief." is none)."""
    lines, tree = _ast_lines(code), _parsed(code)
    if tree is None:
        return [line.rstrip() for line in lines if _IMPORT.match(line) and _an_import(line)]
    found = ["\n".join(lines[node.lineno - 1:node.end_lineno]).rstrip() for node in tree.body
             if isinstance(node, (ast.Import, ast.ImportFrom))]
    return list(dict.fromkeys(found))       # two statements on one line: the line once


def _an_import(line: str) -> bool:
    tree = _parsed(line)
    return tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], (ast.Import, ast.ImportFrom))


def _parsed(code: str) -> ast.Module | None:
    """`code`'s syntax tree, or None where it does not parse."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _ast_lines(code: str) -> list[str]:
    """`code`'s lines as ast numbers them (str.splitlines breaks at more characters)."""
    return code.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def with_imports(code: str, prompt: str) -> str:
    """`code` with the prompt's import lines it does not contain put first (after its docstring and
    `from __future__` imports, which must stay first; a `__future__` import of the prompt's leads). Code
    with no statement, and code whose first statement line (comments do not count, as for Python's
    indentation) is indented (a function body that continues the prompt, which holds the imports), are
    left as they are."""
    first = next((line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")
    have = set(import_lines(code))
    missing = [line for line in import_lines(prompt) if line not in have]
    if not missing or not first or first[:1] in (" ", "\t"):
        return code
    missing.sort(key=lambda line: not _is_future(line))     # a __future__ import must come first
    head = _future_end(code)
    if not head:
        return "\n".join(missing) + "\n\n" + code
    lines = _ast_lines(code)
    return "\n".join([*lines[:head], *missing, *lines[head:]])


def _is_future(line: str) -> bool:
    return re.match(r"from[ \t]+__future__[ \t]", line) is not None


def _future_end(code: str) -> int:
    """The lines of `code` up to its last `from __future__` import (after its docstring), which must stay
    first in the program; 0 when it has none (or does not parse)."""
    tree = _parsed(code)
    if tree is None:
        return 0
    end = 0
    for k, node in enumerate(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            end = node.end_lineno
        elif not (k == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str)):     # the docstring may come before
            break
    return end


def chat_completion(response: str, prompt: str) -> str:
    """What a chat-mode answer contributes as code: the extracted code with the prompt's missing imports."""
    return with_imports(extract_code(response), prompt)


def parses(code: str) -> bool:
    """Whether `code` compiles as Python (compile(): ast.parse's syntax and the compiler's checks, such as
    'return' outside a function, which the evaluation would fail on too; nothing is run)."""
    try:
        with warnings.catch_warnings():       # SyntaxWarnings (an invalid escape) are not failures
            warnings.simplefilter("ignore")
            compile(code, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):  # ValueError: NUL bytes
        return False
    return True


def open_fence(response_prefix: str) -> str | None:
    """The backticks of the fenced block still open at the end of `response_prefix` (an answer opened with
    it starts inside that block, and a line of them at the start of a line is the block's end), or None."""
    at = 0
    while (opening := _OPENING.search(response_prefix, at)) is not None:
        ticks = opening.group(1)
        closing = _closing(len(ticks)).search(response_prefix, min(opening.end() + 1, len(response_prefix)))
        if closing is None:
            return ticks
        at = closing.end()
    return None

"""Chat code completion: the instruction, the code taken out of an answer, the prompt's imports."""
from __future__ import annotations

import pytest

from lp.jobs.code import (CHAT_CODE_STOP, CODE_INSTRUCTION, RESPONSE_PREFIX, chat_completion, chat_message,
                          extract_code, import_lines, open_fence, parses, with_imports)

CODE = "def add(a, b):\n    return a + b"


def test_fenced_with_a_language_tag():
    assert extract_code(f"```python\n{CODE}\n```") == CODE
    assert extract_code(f"```py\n{CODE}\n```\n") == CODE


def test_fenced_without_a_language_tag():
    assert extract_code(f"```\n{CODE}\n```") == CODE


def test_no_fence_is_the_whole_answer():
    assert extract_code(CODE) == CODE
    assert extract_code("    return a + b\n") == "    return a + b\n"  # a body, kept exactly
    assert extract_code("") == ""


def test_text_before_and_after_the_fence():
    answer = f"Here is the function:\n\n```python\n{CODE}\n```\n\nIt adds `a` and `b`.\n```\nmore\n```"
    assert extract_code(answer) == CODE


def test_unterminated_fence_runs_to_the_end():
    assert extract_code(f"```python\n{CODE}") == CODE       # what the stop at "\n```" leaves
    assert extract_code(f"Sure.\n```python\n{CODE}\n") == CODE
    assert extract_code("```python") == "" and extract_code("```python\n") == ""


def test_only_the_first_block_and_inline_backticks_are_not_fences():
    answer = f"Use `x`:\n```python\n{CODE}\n```\n```python\nprint(add(1, 2))\n```"
    assert extract_code(answer) == CODE
    assert extract_code("call ```add``` here") == "call ```add``` here"  # not at the start of a line
    assert extract_code("```python\ns = '```'\n```") == "s = '```'"     # a fence is a whole line


def test_a_fence_is_indented_by_at_most_three_spaces():
    """As Markdown reads fences: a docstring's example fence (4 spaces in) is code, not the block's end."""
    docstring = "def f():\n    '''Example:\n    ```python\n    f()\n    ```\n    '''\n    return 1"
    assert extract_code(f"```python\n{docstring}\n```") == docstring
    assert extract_code(f"```python\n{docstring}") == docstring        # cut by the stop, unclosed
    assert extract_code(f"  ```python\n{CODE}\n   ```\nprose") == CODE  # fences 2 and 3 spaces in
    assert extract_code(f"```python\n{CODE}\n\t```\n") == f"{CODE}\n\t```"   # a tab is 4 columns


def test_the_stop_string_is_the_closing_fence_only():
    (stop,) = CHAT_CODE_STOP
    prefixed = RESPONSE_PREFIX + f"\n{CODE}\n```\nprose"  # the answer opened by the response prefix
    generated = prefixed[len(RESPONSE_PREFIX):]
    assert generated.find(stop) == generated.index("\n```")  # the first hit is the closing fence
    cut = RESPONSE_PREFIX + generated[:generated.find(stop)]
    assert extract_code(cut) == CODE
    # an answer that opens its own fence at its very start is not cut there
    assert f"```python\n{CODE}".find(stop) == -1
    # an empty block still ends in the stop string: the prefix leaves the newline to the model
    assert ("\n```" + "\nprose").find(stop) == 0 and not RESPONSE_PREFIX.endswith("\n")


def test_chat_message_puts_the_prompt_in_a_fenced_block():
    prompt = "from typing import List\n\ndef f(x: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n\n"
    message = chat_message(prompt)
    assert message == CODE_INSTRUCTION.replace("{prompt}", prompt.rstrip())
    assert extract_code(message) == prompt.rstrip()  # the prompt sits in the first fenced block, intact
    assert chat_message("x = 1", "Finish: {prompt} now") == "Finish: x = 1 now"


PROMPT = "import math\nfrom typing import List\n\n\ndef f(xs: List[float]) -> float:\n    \"\"\"doc\"\"\"\n"


def test_import_lines_are_top_level_imports():
    assert import_lines(PROMPT) == ["import math", "from typing import List"]
    assert import_lines("def g():\n    import os\nimportant = 1\n") == []


def test_prose_is_no_import():
    """A chat prompt in prose: a line that starts with 'from ' or 'import ' is no import statement, and
    nothing is put in front of the answer; an import line of a prompt that does not parse still counts,
    and so does an import inside a docstring of a prompt that does (nowhere: it is no statement)."""
    prose = "from now on, answer in one word.\nimport this list into a table?\nWhat colour is the sky?"
    assert import_lines(prose) == []
    assert chat_completion("Blue.", prose) == "Blue."
    assert import_lines("import os\nfrom now on, be brief.\nfrom a.b import (c,\n") == ["import os"]
    assert import_lines('def f():\n    """\nimport os\n    """\nimport re; import json\n') == [
        "import re; import json"]
    assert import_lines("from typing import (List,\n    Dict)\nx = 1\n") == ["from typing import (List,\n    Dict)"]
    # line breaks that str.splitlines knows and ast does not (a form feed, U+2028 in a string)
    assert import_lines('x = "a\u2028b"\nimport os\n') == import_lines("x = 1\x0c\nimport os\r\n") == ["import os"]


def test_missing_imports_are_added():
    code = "def f(xs: List[float]) -> float:\n    return math.fsum(xs)"
    done = with_imports(code, PROMPT)
    assert done == "import math\nfrom typing import List\n\n" + code
    assert parses(done)
    partial = "import math\n\n" + code
    assert with_imports(partial, PROMPT) == "from typing import List\n\n" + partial
    complete = "import math\nfrom typing import List\n" + code
    assert with_imports(complete, PROMPT) == complete


def test_missing_imports_go_after_the_answers_future_imports():
    """A chat answer opening with `from __future__ import annotations` got the skeleton's imports before
    it: a SyntaxError (from __future__ imports must occur at the beginning of the file), so a class that
    passes its tests failed them. The imports now go after the answer's __future__ imports (and its
    docstring), and a __future__ import the answer lacks goes first."""
    code = "def f(xs: List[float]) -> float:\n    return math.fsum(xs)"
    future = '"""Sums."""\nfrom __future__ import annotations\n\n' + code
    done = with_imports(future, PROMPT)
    assert done == '"""Sums."""\nfrom __future__ import annotations\nimport math\nfrom typing import List\n\n' + code
    assert parses(done)
    assert parses(with_imports("from __future__ import annotations\r\n" + code, PROMPT))
    prompt = "import math\nfrom __future__ import annotations\nfrom typing import List\n"
    assert with_imports(code, prompt) == ("from __future__ import annotations\nimport math\nfrom typing import List\n\n"
                                          + code)
    assert parses(with_imports(code, prompt))


def test_a_body_continuation_gets_no_imports():
    body = "    return math.fsum(xs)\n"
    assert with_imports(body, PROMPT) == body
    assert with_imports("\n\n" + body, PROMPT) == "\n\n" + body


def test_a_body_that_starts_with_a_column_0_comment_gets_no_imports():
    """Python ignores comments for indentation: a body-only answer that opens with a column-0 comment
    continues the prompt's function. Imports put before it made `prompt + completion` an IndentationError."""
    body = "# check every pair\n    return math.fsum(xs)\n"
    assert with_imports(body, PROMPT) == body
    assert parses('def f(xs):\n    "doc"\n' + with_imports(body, PROMPT))
    assert with_imports("# a helper\ndef g():\n    return 1", PROMPT).startswith("import math\n")


def test_a_crlf_closing_fence_and_longer_fences_close_the_block():
    """A closing fence ending in \\r\\n was not one (the completion ran into the prose after it); a block
    opened with four backticks was not a block, and closes only at four or more."""
    assert extract_code("```python\r\ndef f():\r\n    return 1\r\n```\r\nThis returns one.\r\n") == \
        "def f():\r\n    return 1"
    assert extract_code("````python\n" + CODE + "\n```\n````\nprose") == CODE + "\n```"   # 3 close no 4
    assert extract_code("```python\n" + CODE + "\n````\nprose") == CODE


def test_the_default_stop_is_the_fence_the_response_prefix_leaves_open():
    """With a prefix that leaves no block open, "\\n```" stopped the answer at its own opening fence
    after a line of prose: the chat mode then stops at no string. A prefix that leaves one open stops at
    its closing fence (four backticks: four), wherever in the prefix it opened."""
    from lp.jobs.config import DataSection, default_stop
    for prefix, ticks in ((RESPONSE_PREFIX, "```"), ("```python\n", "```"), ("Sure:\n```py\ndef f():", "```"),
                          ("````python", "````"), ("", None), ("```python\nx = 1\n```", None), ("x```python", None)):
        assert open_fence(prefix) == ticks, prefix
        assert default_stop(DataSection(response_prefix=prefix)) == (() if ticks is None else ("\n" + ticks,))
    assert default_stop(DataSection()) == CHAT_CODE_STOP


def test_chat_completion_extracts_then_completes_the_imports():
    response = "```python\ndef f(xs: List[float]) -> float:\n    return sum(xs)"
    assert chat_completion(response, PROMPT) == ("import math\nfrom typing import List\n\n"
                                                 "def f(xs: List[float]) -> float:\n    return sum(xs)")
    assert chat_completion("```python\n", PROMPT) == ""  # an empty block adds no imports


@pytest.mark.parametrize("code,ok", [(CODE, True), ("", True), ("def f(:\n", False), ("x = 1.0f", False),
                                     ("(" * 300 + ")" * 300, False), ("a = 1\0", False),
                                     ("return 1\n", False), ("break\n", False), ("def f(a, a):\n    pass", False),
                                     ("s = '\\d'", True)])     # the compiler's checks; a SyntaxWarning is no failure
def test_parses(code, ok):
    assert parses(code) is ok

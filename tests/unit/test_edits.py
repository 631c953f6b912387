"""Edits (search/replace) turned into a unified diff that `git apply` takes, and why an edit
that does not match does not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fleet_pipelines.domain.edits import (
    Edit,
    answer_schema,
    apply_edits,
    edits_from_json,
    parse_edit_blocks,
)

CALC = '"""Tiny arithmetic."""\n\n\ndef add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n'
FILES = {
    "calc.py": CALC,
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}


def git_apply(tmp_path: Path, files: dict[str, str], patch: str) -> dict[str, str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "p.diff").write_text(patch)
    subprocess.run(["git", "-C", str(tmp_path), "apply", "p.diff"], check=True, capture_output=True)
    return {name: (tmp_path / name).read_text() for name in files}


def test_a_block_becomes_a_diff_git_applies(tmp_path):
    reply = (
        "The sign is wrong.\n\ncalc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n"
        "    return a + b\n>>>>>>> REPLACE\n"
    )
    edits = parse_edit_blocks(reply)
    assert edits == [Edit(path="calc.py", search="    return a - b", replace="    return a + b")]
    outcome = apply_edits(FILES, edits)
    assert outcome.ok and outcome.changed == ["calc.py"]
    assert "-    return a - b\n+    return a + b\n" in outcome.patch
    assert git_apply(tmp_path, FILES, outcome.patch)["calc.py"] == CALC.replace("a - b", "a + b")


def test_blocks_in_fences_and_several_files():
    reply = (
        "```python\ncalc.py\n<<<<<<< SEARCH\n    return a * b\n=======\n"
        "    return b * a\n>>>>>>> REPLACE\n```\n"
        "tests/test_calc.py\n<<<<<<< SEARCH\n    assert add(2, 3) == 5\n=======\n    assert add(2, 3) == 5\n"
        "    assert add(0, 0) == 0\n>>>>>>> REPLACE\n"
    )
    edits = parse_edit_blocks(reply)
    assert [e.path for e in edits] == ["calc.py", "tests/test_calc.py"]
    assert apply_edits(FILES, edits).changed == ["calc.py", "tests/test_calc.py"]


def test_a_dropped_indentation_takes_the_files(tmp_path):
    outcome = apply_edits(FILES, [Edit(path="calc.py", search="    return a - b", replace="return a + b")])
    assert git_apply(tmp_path, FILES, outcome.patch)["calc.py"] == CALC.replace("a - b", "a + b")


def test_blank_differences_still_match_whole_lines():
    outcome = apply_edits(FILES, [Edit(path="calc.py", search="return a - b  \n", replace="return a + b\n")])
    assert outcome.ok
    assert "+    return a + b\n" in outcome.patch


def test_each_failure_says_which_edit_and_why():
    outcome = apply_edits(
        FILES,
        [
            Edit(path="calc.py", search="return a - b", replace="return a + b"),
            Edit(path="calc.pyy", search="x", replace="y"),
            Edit(path="calc.py", search="return a / b", replace="y"),
            Edit(path="calc.py", search="def mul(a, b):", replace="def mul(a, b):"),
        ],
    )
    assert not outcome.ok
    assert outcome.failures[0] == "edit 2 (calc.pyy): no such file in the repository; did you mean calc.py?"
    assert outcome.failures[1].startswith("edit 3 (calc.py): the search text is not in the file")
    assert outcome.failures[1].endswith("the closest line is 'return a + b'")  # after edit 1
    assert outcome.failures[2] == "edit 4 (calc.py): the replacement is the same as the search text"
    assert outcome.changed == ["calc.py"]  # the edit that matched still applies


def test_an_ambiguous_search_is_refused():
    files = {"a.py": "x = 1\ny = 2\nx = 1\n"}
    outcome = apply_edits(files, [Edit(path="a.py", search="x = 1", replace="x = 3")])
    assert outcome.failures == [
        "edit 1 (a.py): the search text occurs 2 times; give more lines so it is unique"
    ]
    assert outcome.patch == ""


def test_a_whole_line_inside_a_longer_line_is_found_as_the_line():
    files = {"a.py": "    return a\n    return a - b\n"}
    outcome = apply_edits(files, [Edit(path="a.py", search="    return a", replace="    return 0")])
    assert outcome.ok and "-    return a\n+    return 0\n" in outcome.patch


def test_a_new_file(tmp_path):
    outcome = apply_edits(FILES, [Edit(path="notes.txt", search="", replace="hello\n")])
    assert outcome.ok and "new file mode" in outcome.patch
    assert git_apply(tmp_path, FILES, outcome.patch)


def test_json_edits_and_their_errors():
    edits, why = edits_from_json({"edits": [{"path": "calc.py", "search": "a", "replace": "b"}]})
    assert why == "" and edits[0].path == "calc.py"
    assert edits_from_json({"edits": "x"})[1].startswith("`edits` must be a list")
    assert edits_from_json({"edits": [{"search": "a"}]})[1] == "edit 1: path: Field required"
    # a small model writes the same edit again until its token limit: once is what it means
    twice, _ = edits_from_json({"edits": [{"path": "calc.py", "search": "a", "replace": "b"}] * 3})
    assert apply_edits({"calc.py": "a\n"}, twice).ok and len(twice) == 1


def test_the_answer_schema_lists_each_files_lines():
    schema = answer_schema(FILES)
    options = schema["properties"]["edits"]["items"]["anyOf"]
    calc = next(o for o in options if o["properties"]["path"] == {"const": "calc.py"})
    assert "    return a - b" in calc["properties"]["search"]["enum"]
    assert "" not in calc["properties"]["search"]["enum"]
    json.dumps(schema)  # plain JSON, what the engine takes

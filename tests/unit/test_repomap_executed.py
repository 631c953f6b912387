"""Spectrum-guided localisation (`domain.repomap`): the lines the failing tests executed on the
base commit pick, of two functions of one name, the one that ran."""

from fleet_pipelines.domain.repomap import (
    MAX_EXECUTED_RANGES,
    executed_ranges,
    focus,
    ranked_symbols,
    repo_map,
    searches,
    seeds,
)

COMPAT = """import sys

PY3 = sys.version_info[0] == 3

if PY3:

    def pairs(d):
        return list(d.keys())

else:

    def pairs(d):
        return d.iteritems()


def other(d):
    return d
"""
TEXTS = {
    "compat.py": COMPAT,
    "tests/test_compat.py": "from compat import pairs\n\n\ndef test_pairs():\n    pass\n",
}
FAILING = ["tests/test_compat.py::test_pairs"]
RAN = {"tests/test_compat.py::test_pairs": {"compat.py": [(7, 8)]}}  # the Python 3 branch's pairs


def test_executed_lines_become_bounded_ranges_of_the_code_only():
    lines = {
        "compat.py": [8, 7, 1, 3, 3],
        "tests/test_compat.py": [4, 5],
        "README.md": [1],
        "build/x.py": [1],
    }
    assert executed_ranges({"t::a": lines}) == {"t::a": {"compat.py": [(1, 1), (3, 3), (7, 8)]}}
    wide = {f"m{i}.py": range(1, MAX_EXECUTED_RANGES, 2) for i in range(3)}  # every other line
    traced = executed_ranges(
        {"t::wide": wide, "t::none": {"tests/test_x.py": [1]}, "t::narrow": {"n.py": [5]}}
    )
    assert traced == {"t::narrow": {"n.py": [(5, 5)]}}  # a test's whole spectrum or none of it


def test_focus_keeps_the_function_the_failing_tests_ran_and_drops_its_namesake():
    without = focus(TEXTS, "pairs returns keys", FAILING, "")
    assert {"        return list(d.keys())", "        return d.iteritems()"} < set(without["compat.py"])
    narrowed = focus(TEXTS, "pairs returns keys", FAILING, "", RAN)
    assert narrowed == {
        "compat.py": ["    def pairs(d):\n        return list(d.keys())", "        return list(d.keys())"]
    }  # its def line with its body: found once


def test_a_function_that_ran_ranks_above_its_namesake_and_the_map_shows_it_alone():
    found = seeds("pairs returns keys", FAILING, "", RAN)
    first, second = [s for _, s in ranked_symbols(TEXTS, found) if s.name == "pairs"]
    assert (first.first, second.first) == (7, 12)
    assert found.ran(first) and not found.ran(second)
    plain = [s for _, s in ranked_symbols(TEXTS, seeds("pairs returns keys", FAILING, ""))]
    assert {s.name for s in plain[:2]} == {"pairs"}
    text = repo_map(TEXTS, list(TEXTS), "pairs returns keys", FAILING, "", 400, executed=RAN)
    assert "def pairs (lines 7-8)" in text and "(lines 12-13)" not in text


def test_when_the_task_names_a_traced_test_focus_keeps_only_what_that_test_ran():
    traced = {**RAN, "tests/test_compat.py::test_other": {"compat.py": [(16, 17)]}}
    task = "pairs returns keys and other fails"
    assert focus(TEXTS, task, [*traced], "", traced) == {
        "compat.py": [
            *["    def pairs(d):\n        return list(d.keys())", "        return list(d.keys())"],
            "def other(d):",
            "    return d",
        ]
    }
    named = focus(TEXTS, "test_pairs fails: pairs returns keys, other too", [*traced], "", traced)
    assert named == {
        "compat.py": ["    def pairs(d):\n        return list(d.keys())", "        return list(d.keys())"]
    }  # other: the named test never ran it


def test_a_line_not_found_once_is_searched_with_the_lines_after_it_that_make_it_so():
    text = (
        "if PY3:\n    def keys(d):\n        return iter(d.keys())\n"
        "    def items(d):\n        return iter(d.keys())\n"  # the bug: the same body as keys'
        "else:\n    def items(d):\n        return d.iteritems()\n"
    )
    assert searches(text, 4, 5) == ["    def items(d):\n        return iter(d.keys())"]  # nothing alone
    assert searches(text, 7, 8) == [
        "    def items(d):\n        return d.iteritems()",
        "        return d.iteritems()",
    ]

"""Forgeries of the judge through what the tests resolve and what the code hands back (issue 40):
a module the patch adds that shadows the tests' own helper (flat and src/ layouts), an edit of
data only the tests import, a star import that binds `abs` and `sorted`, a StopIteration that
makes `all(map(...))` hold, objects whose operators, context managers, pickling or callbacks
would reach the expected value or the judge, a record the code rewrites once the test has made
the expected one, and state kept across contradictory hidden tests.
Each scores no higher, and gets no better verdict, than the honest wrong patch, in the three
identities of the sandbox suite (real git, real sandbox, real pytest)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest

from tests.integration.sandbox_identities import (
    Box,
    _blocked_in_every_identity,
    harness_call,
    identity_box,  # noqa: F401 (the fixture `box`)
)
from tests.integration.test_repo_hostile import IDENTITIES, Judged, diff, judged_repository

CORE = textwrap.dedent(
    '''
    """Tiny arithmetic."""

    import dataclasses


    def add(a, b):
        return a - b


    def mul(a, b):
        return a * b


    def apply(f, x):
        return f(x)


    def suppressed():
        import contextlib

        return contextlib.nullcontext()


    DEFAULTS = {"base": 10}


    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int
        y: int
    '''
).lstrip()
CASES = (
    '"""The cases the tests run (data only)."""\n\n'
    + "ADD_CASES = [(2, 3, 5), (4, 1, 5)]\nMUL_CASES = [(2, 3, 6)]\n"
)
HELPERS = "def check(got, want):\n    assert got == want\n"
VISIBLE = textwrap.dedent(
    """
    from helpers import check

    from calc import add, mul
    from calc.cases import ADD_CASES, MUL_CASES


    def test_add():
        for a, b, want in ADD_CASES:
            check(add(a, b), want)


    def test_mul():
        for a, b, want in MUL_CASES:
            check(mul(a, b), want)
    """
).lstrip()
FILES = {
    "calc/__init__.py": "from .core import *  # noqa: F403\n",
    "calc/core.py": CORE,
    "calc/cases.py": CASES,
    "tests/helpers.py": HELPERS,
    "tests/test_calc.py": VISIBLE,
}
# The hidden tests compare on the test side: each form below handed the code the expected value,
# or let the code's object or exception decide, under a naive design.
HIDDEN = textwrap.dedent(
    """
    import copy
    import pickle

    import pytest

    import calc
    from calc import *


    def test_builtins_stay_builtins():
        assert abs(add(2, 3) - 5) < 1e-9 and sorted([add(1, 1), 0]) == [0, 2]


    def test_a_stop_is_no_end():
        assert all(map(lambda c: add(c[0], c[1]) == c[2], [(2, 3, 5), (4, 1, 5)]))


    def test_approx():
        assert pytest.approx(2.5) == add(1, 1.5)


    def test_a_context_of_the_code():
        with calc.suppressed():
            assert add(4, 1) == 5


    def test_copies():
        assert copy.deepcopy(calc.DEFAULTS) == pickle.loads(pickle.dumps(calc.DEFAULTS)) == {"base": 10}
        assert add(-2, -3) == -5


    def test_a_callback():
        assert calc.apply(lambda x: add(x, 1), 4) == 5


    def test_points():
        assert calc.Point(add(1, 1), 0) == calc.Point(2, 0)
    """
).lstrip()
CONTRADICTORY = (  # an impossible task: no function passes both
    "from calc import add\n\n\ndef test_one():\n    assert add(1, 1) == 2\n\n\n"
    "def test_other():\n    assert add(1, 1) == 3\n"
)
LIAR = (
    "\n\nclass Liar(float):\n"
    "    def __eq__(self, other):\n        return True\n\n"
    "    def __sub__(self, other):\n        return 0.0\n\n"
    "    __rsub__ = __sub__\n    __hash__ = float.__hash__\n"
)
HONEST_WRONG = diff("calc/core.py", CORE, CORE.replace("return a - b", "return b - a"))
HONEST_FIX = diff("calc/core.py", CORE, CORE.replace("return a - b", "return a + b"))
BREAKS_MUL = diff("calc/core.py", CORE, CORE.replace("return a * b", "return a + b"))  # a regression
SHADOW = "def check(got, want):\n    pass\n"


def core_with(old: str, new: str) -> str:
    assert old in CORE
    return diff("calc/core.py", CORE, CORE.replace(old, new))


# Each forgery with the patch it forges for (by default the honest wrong patch): it scores no
# higher than that patch alone. The first three hide a regression of a test that passes at the base.
FORGERIES: dict[str, str] = {
    "a root module shadows the tests' own helper": BREAKS_MUL + diff("helpers.py", None, SHADOW),
    "a src/ module shadows the tests' own helper": BREAKS_MUL + diff("src/helpers.py", None, SHADOW),
    "edits the data only the tests import to match the regression": BREAKS_MUL
    + diff("calc/cases.py", CASES, CASES.replace("(2, 3, 6)", "(2, 3, 5)")),
    "a star import binds abs, sorted and pytest": core_with(
        '"""Tiny arithmetic."""\n',
        '"""Tiny arithmetic."""\n\n\ndef abs(x):\n    return 0\n\n\ndef sorted(x):\n    return [0, 2]\n\n\n'
        "class pytest:\n    def approx(self, *a):\n        return 0\n",
    ),
    "raises StopIteration so that all(map(...)) holds": core_with(
        "    return a - b\n", "    raise StopIteration\n"
    ),
    "returns an object whose operators take the expected value": diff(
        "calc/core.py",
        CORE,
        CORE.replace('"""Tiny arithmetic."""\n', '"""Tiny arithmetic."""\n' + LIAR).replace(
            "    return a - b\n", "    return Liar(a - b)\n"
        ),
    ),
    "a context manager of the code suppresses the assertion": core_with(
        "    return contextlib.nullcontext()\n",
        "    class Swallow:\n        def __enter__(self):\n            return self\n\n"
        "        def __exit__(self, *exc):\n            return True\n\n    return Swallow()\n",
    ),
    "pickling or copying a code object runs the code's fix in the judge": core_with(
        'DEFAULTS = {"base": 10}\n',
        "class Defaults(dict):\n    def __reduce__(self):\n"
        '        return (exec, ("import calc.core as c; c.add = lambda a, b: a + b",))\n\n'
        "    def __deepcopy__(self, memo):\n"
        '        exec("import calc.core as c; c.add = lambda a, b: a + b")\n'
        "        return {'base': 10}\n\n\n"
        "DEFAULTS = Defaults(base=10)\n",
    ),
    "rewrites the object it returned once the test made the expected one": core_with(
        "    y: int\n",
        "    y: int\n\n    def __post_init__(self):\n"
        "        for made in _MADE:\n            object.__setattr__(made, 'x', self.x)\n"
        "        _MADE.append(self)\n\n\n_MADE = []\n",
    ),
    "a callback walks to the test's globals": core_with(
        "    return f(x)\n",
        "    for value in f.__globals__.values():\n        if getattr(value, '__name__', '') == 'add':\n"
        "            value.__globals__['add'] = lambda a, b: a + b\n    return f(x)\n",
    ),
}
STATEFUL = diff(
    "calc/core.py",
    CORE,
    CORE.replace('"""Tiny arithmetic."""\n', '"""Tiny arithmetic."""\n\n_CALLS = []\n').replace(
        "    return a - b\n", "    _CALLS.append(1)\n    return a + b + (len(_CALLS) > 1)\n"
    ),
)
FLAGGED = {"edits the data only the tests import to match the regression"}
WITHOUT = dict.fromkeys(list(FORGERIES)[:3], BREAKS_MUL)  # else the honest wrong patch


@pytest.fixture(scope="module", params=IDENTITIES)
def judged(request) -> Iterator[Judged]:
    with judged_repository(request.param, FILES, HIDDEN) as done:
        yield done


@pytest.fixture(scope="module")
def honest(judged: Judged) -> dict:
    """The patches the forgeries are measured against, judged once per identity."""
    return {patch: judged.judge(patch) for patch in (HONEST_WRONG, HONEST_FIX, BREAKS_MUL)}


def test_the_honest_fix_passes_everything_the_code_can_answer(judged: Judged, honest):
    (wrong, wrong_checks, _), (fixed, fixed_checks, _) = honest[HONEST_WRONG], honest[HONEST_FIX]
    broken = honest[BREAKS_MUL][0]
    if not judged.runs:
        assert fixed.not_run and wrong.not_run and fixed_checks["tests"].not_run
        return
    assert fixed.tests.passed >= wrong.tests.passed > broken.tests.passed, (fixed.tests, broken.tests)
    # every hidden test is judged: the code's context manager runs in its process (as a handle),
    # the tests' lambda in theirs (as a callback)
    assert fixed.hidden.passed == 7 and wrong.hidden.passed == 0, (fixed.hidden, wrong.hidden)
    assert fixed.hidden.cannot_cross == []
    assert not fixed.flags and not wrong.flags
    assert fixed_checks["tests"].value > wrong_checks["tests"].value


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forgery_scores_no_higher_than_the_patch_it_forges_for(judged: Judged, honest, name: str):
    forged, checks, candidate = judged.judge(FORGERIES[name])
    if not judged.runs:
        assert forged.not_run and checks["tests"].not_run and checks["tests"].value is None
        return
    plain, plain_checks, plain_candidate = honest[WITHOUT.get(name, HONEST_WRONG)]
    assert forged.applies, forged.apply_output
    assert checks["tests"].value <= plain_checks["tests"].value, (name, checks["tests"].evidence)
    assert forged.tests.passed <= plain.tests.passed, forged.tests
    assert forged.hidden.passed <= plain.hidden.passed, forged.hidden
    assert not candidate.passed and candidate.examples_passed <= plain_candidate.examples_passed
    if name in FLAGGED:
        assert forged.flags == ["calc/cases.py: test file"] and forged.touches_tests, forged.flags
        assert checks["patch_scope"].value == 0.0
    else:
        assert not forged.flags, forged.flags  # a module the patch adds is no test edit


def test_state_kept_across_contradictory_hidden_tests_passes_no_impossible_task(judged: Judged):
    forged, _, forged_candidate = judged.judge(STATEFUL, CONTRADICTORY)
    fixed, _, _ = judged.judge(HONEST_FIX, CONTRADICTORY)
    if not judged.runs:
        assert forged.not_run and fixed.not_run
        return
    assert fixed.hidden.passed == 1  # any one function passes one of the two
    assert forged.hidden.passed <= fixed.hidden.passed and forged.hidden.status == "failed", forged.hidden
    assert not forged_candidate.passed


# --- function tasks: the same exception rule in the function harness (init.py) ---

TASK_TESTS = (
    "def test_all():\n    assert all(map(lambda c: add(c[0], c[1]) == c[2], [(1, 2, 3), (2, 2, 4)]))\n"
)
EXAMPLES = [("add(1, 2)", "3")]


@_blocked_in_every_identity
def test_a_function_that_raises_stopiteration_passes_nothing_an_honest_wrong_one_fails(box: Box):
    stop = "def add(a, b):\n    raise StopIteration\n"
    wrong = "def add(a, b):\n    return a - b\n"
    interrupt = "def add(a, b):\n    raise KeyboardInterrupt\n"
    runs = box.many(
        [harness_call(s, EXAMPLES, TASK_TESTS, entry_points=["add"]) for s in (stop, wrong, interrupt)]
    )
    passed = [[o["name"] for o in run.outcomes if o["passed"]] for run in runs]
    assert passed == [[], [], []], passed
    details = [o["detail"] for o in runs[0].outcomes]
    assert any("StopIteration raised in the code under test" in d for d in details), details


# --- doctests: their text is the base commit's, their names the code's ---

SLUG = textwrap.dedent(
    '''
    """Slugs.

    >>> slugify("Hello World")
    'hello-world'
    """

    from .util import join


    def slugify(text):
        """A slug.

        >>> slugify("A b")
        'a-b'
        """
        return join(text.lower().split())
    '''
).lstrip()
UTIL = textwrap.dedent(
    '''
    def join(words):
        """Words joined.

        >>> join(["a", "b"])
        'a-b'
        """
        return "-".join(words)
    '''
).lstrip()
DOCTEST_FILES = {
    "slug/__init__.py": SLUG,
    "slug/util.py": UTIL,
    "pytest.ini": "[pytest]\naddopts = --doctest-modules\n",
    "tests/test_slug.py": "from slug import slugify\n\n\ndef test_slug():\n"
    "    assert slugify('X y') == 'x-y'\n",
}
REGRESSION = diff("slug/util.py", UTIL, UTIL.replace('"-".join', '"_".join'))
HIDDEN_REGRESSION = diff(  # and every doctest rewritten to expect it
    "slug/util.py", UTIL, UTIL.replace('"-".join', '"_".join').replace("'a-b'", "'a_b'")
) + diff("slug/__init__.py", SLUG, SLUG.replace("'hello-world'", "'hello_world'").replace("'a-b'", "'a_b'"))


@pytest.fixture(scope="module")
def doctested(judged: Judged) -> Iterator[dict]:
    """The doctest repository's judgements in the identity of `judged` (its sandboxes run the
    same way): a comment, a regression, and the regression with every doctest rewritten to
    expect it."""
    with judged_repository(judged.identity, DOCTEST_FILES, "") as done:
        comment = diff("slug/util.py", UTIL, "# joined\n" + UTIL)
        yield {
            name: done.judge(p)
            for name, p in (("comment", comment), ("broken", REGRESSION), ("forged", HIDDEN_REGRESSION))
        }


def test_doctests_are_judged_and_a_patch_that_edits_their_text_is_flagged(judged: Judged, doctested: dict):
    (plain, _, _), (broken, _, _), (forged, checks, _) = doctested.values()
    if not judged.runs:
        assert plain.not_run and broken.not_run and forged.not_run
        return
    assert plain.tests.passed == 4 and plain.tests.failed == 0, plain.tests  # three doctests, one test
    assert not plain.flags and broken.tests.passed == 0 and not broken.flags, broken.tests
    assert sorted(forged.flags) == ["slug/__init__.py: test file", "slug/util.py: test file"], forged.flags
    assert checks["patch_scope"].value == 0.0


def test_an_edited_docstring_hides_no_regression(judged: Judged, doctested: dict):
    (broken, broken_checks, _), (forged, forged_checks, _) = doctested["broken"], doctested["forged"]
    if not judged.runs:
        assert forged_checks["tests"].value is None
        return
    assert forged.tests.passed <= broken.tests.passed, forged.tests
    assert forged_checks["tests"].value <= broken_checks["tests"].value

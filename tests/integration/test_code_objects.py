"""Objects of the code under test cross the boundary as handles, and the tests' callables as
callbacks: a hidden test that builds an instance, iterates a generator, hands the code a lambda
or reads a namedtuple is judged, and the code still never receives what the test compares
against. Real git, real sandbox."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_pipelines.domain.models import RepoSpec
from fleet_pipelines.workspace.checkout import make_writable
from fleet_pipelines.workspace.prepare import prepare_workspace
from fleet_pipelines.workspace.runs import score_patch
from tests.integration.test_repo_hostile import diff, make_repo, needs_sandbox

SHAPES = textwrap.dedent(
    """
    import collections
    import contextlib

    Point = collections.namedtuple("Point", "x y")


    class Version:
        def __init__(self, major, minor=0):
            self.major, self.minor = major, minor

        @classmethod
        def parse(cls, text):
            major, minor = text.split(".")
            return cls(int(major), int(minor))

        def bump(self):
            return Version(self.major + 1, self.minor)

        def __str__(self):
            return f"{self.major}.{self.minor}"

        def __eq__(self, other):
            return (self.major, self.minor) == (other.major, other.minor)


    def countdown(n):
        while n > 0:
            yield n
            n -= 1


    def apply(function, items):
        return [function(x) for x in items]


    def midpoint(a, b):
        return Point((a.x + b.x) / 2, (a.y + b.y) / 2)


    @contextlib.contextmanager
    def opened(log):
        log.append("open")
        yield len(log)
        log.append("closed")
    """
)
VISIBLE = textwrap.dedent(
    """
    from shapes import Point, Version, apply, countdown


    def test_parse():
        assert Version.parse("1.2").minor == 2


    def test_countdown():
        assert list(countdown(2)) == [2, 1]


    def test_apply():
        assert apply(str, [1]) == ["1"]


    def test_point():
        assert Point(1, 2).y == 2
    """
)
HIDDEN = textwrap.dedent(
    """
    import pytest

    from shapes import Point, Version, apply, countdown, midpoint, opened


    def test_bump():
        v = Version.parse("1.2").bump()
        assert str(v) == "2.0"
        assert (v.major, v.minor) == (2, 0)
        assert isinstance(v, Version) and not isinstance(3, Version)


    def test_generator_callback_namedtuple_and_context():
        assert list(countdown(3)) == [3, 2, 1]
        seen = []
        assert apply(lambda x: seen.append(x) or x * 2, [1, 2]) == [2, 4]
        assert seen == [1, 2]
        p = midpoint(Point(0, 0), Point(2, 4))
        assert p == (1.0, 2.0) and p.x == 1.0 and p == pytest.approx((1, 2))
        log = []
        with opened(log) as size:
            assert size == 1
        assert log == ["open", "closed"]  # the tests' list, which the code held: one list


    def test_equality_of_two_objects_of_the_code():
        assert Version(2) == Version.parse("2.0")
    """
)
FIX = diff(
    "shapes.py", SHAPES, SHAPES.replace("Version(self.major + 1, self.minor)", "Version(self.major + 1, 0)")
)
HIDDEN_IDS = ("test_bump", "test_generator_callback_namedtuple_and_context")


@pytest.fixture
def workspace(tmp_path, traversable_dir):
    source = make_repo(tmp_path / "src", {"shapes.py": SHAPES, "tests/test_shapes.py": VISIBLE})
    return prepare_workspace("objects", RepoSpec(url=str(source)), traversable_dir / "ws")


@needs_sandbox
def test_hidden_tests_that_use_objects_of_the_code_are_judged(workspace):
    """The fix passes both hidden tests that use instances, a generator, a callback, a
    namedtuple and a context manager; a comment patch fails the one the fix is about. A test that
    compares two objects of the code (their __eq__ would receive the expected object) cannot be
    judged: listed, left out."""
    fixed = score_patch(workspace, FIX, HIDDEN)
    assert fixed.hidden is not None, fixed
    assert (fixed.hidden.passed, fixed.hidden.failed) == (2, 0), fixed.hidden
    assert fixed.hidden.cannot_cross == ["test_fleet_hidden.py::test_equality_of_two_objects_of_the_code"]
    assert fixed.tests is not None and fixed.tests.status == "passed", fixed.tests
    comment = diff("shapes.py", SHAPES, SHAPES.replace("import collections", "import collections  # x"))
    unfixed = score_patch(workspace, comment, HIDDEN)
    assert unfixed.hidden is not None and (unfixed.hidden.passed, unfixed.hidden.failed) == (1, 1), (
        unfixed.hidden
    )
    assert unfixed.hidden.failing == ["test_fleet_hidden.py::test_bump"]


# The task: bump() must reset the minor version. Each hidden test compares the same value of the
# code against one of the tests' in another way the code could try to answer for.
FORGERY_HIDDEN = textwrap.dedent(
    """
    import copy

    from shapes import Version, apply, opened


    def bumped():
        return Version.parse("1.2").bump()


    def test_in_a_context():
        with opened([]):
            assert bumped().minor == 0


    def test_as_a_tuple():
        v = bumped()
        assert (v.major, v.minor) == (2, 0)


    def test_in_a_list():
        assert [bumped().minor] == [0]


    def test_by_arithmetic():
        assert bumped().minor + 1 == 1


    def test_by_membership():
        assert bumped().minor in (0,)


    def test_through_a_callback():
        assert apply(lambda x: x + 1, [bumped().minor]) == [1]


    def test_a_copy():
        assert copy.deepcopy(bumped()).minor == 0
    """
)
FORGERY_TESTS = 7


def _bump(body: str, prelude: str) -> str:
    patched = SHAPES.replace("Version(self.major + 1, self.minor)", body)
    return patched.replace("import collections\n", f"import collections\n{prelude}")


_LIAR = """
class _Any(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__
    __ne__ = lambda self, other: False
    __add__ = __radd__ = lambda self, other: _Any(1)
"""
_TAKER = """
class _Taker:
    def __eq__(self, other):
        return True

    def __add__(self, other):
        return other - 1 if isinstance(other, int) else self

    __radd__ = __add__

    def __contains__(self, item):
        return True

    def __hash__(self):
        return 0
"""
# The forged shapes.py: each keeps the honest wrong value (minor 2) and makes it answer for itself.
CODE_FORGERIES = {
    "attributes that equal anything (an int subclass)": _bump(
        "Version(_Any(self.major + 1), _Any(self.minor))", _LIAR
    ),
    "an object whose operators take the expected value": _bump("Version(self.major + 1, _Taker())", _TAKER),
    "a context manager that suppresses the failed assertion": SHAPES.replace(
        "@contextlib.contextmanager\ndef opened(log):", "@contextlib.contextmanager\ndef _opened(log):"
    )
    + "\n\nclass opened:\n    def __init__(self, log):\n        pass\n\n"
    "    def __enter__(self):\n        return self\n\n"
    "    def __exit__(self, *exc):\n        return True\n",
    "reads the callback's code for the test's constants": SHAPES.replace(
        "return [function(x) for x in items]", "return [function.__code__.co_consts[-1] for x in items]"
    ),
}


def plain_pytest_passes(shapes: str, tmp: Path) -> int:
    """How many hidden tests plain pytest passes with `shapes` in process (on the host: the
    forgeries are this module's own code)."""
    (tmp / "shapes.py").write_text(shapes)
    (tmp / "test_hidden.py").write_text(FORGERY_HIDDEN)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "test_hidden.py"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run.stdout.count("PASSED ")


@pytest.fixture(scope="module")
def forgery_workspace() -> Iterator[object]:
    made = Path(tempfile.mkdtemp(prefix="fleet-test-"))
    os.chmod(made, 0o755)
    source = make_repo(made / "src", {"shapes.py": SHAPES, "tests/test_shapes.py": VISIBLE})
    yield prepare_workspace("forged-objects", RepoSpec(url=str(source)), made / "ws")
    make_writable(made)
    shutil.rmtree(made, ignore_errors=True)


@needs_sandbox
def test_the_fix_passes_and_the_honest_wrong_patch_fails_the_forgery_task(forgery_workspace, tmp_path):
    assert plain_pytest_passes(SHAPES, tmp_path) == 0
    fixed = score_patch(forgery_workspace, FIX, FORGERY_HIDDEN)
    assert fixed.hidden is not None and (fixed.hidden.passed, fixed.hidden.failed) == (FORGERY_TESTS, 0), (
        fixed.hidden
    )
    comment = diff("shapes.py", SHAPES, SHAPES.replace("import collections", "import collections  # x"))
    wrong = score_patch(forgery_workspace, comment, FORGERY_HIDDEN)
    assert wrong.hidden is not None and (wrong.hidden.passed, wrong.hidden.failed) == (0, FORGERY_TESTS), (
        wrong.hidden
    )


@needs_sandbox
@pytest.mark.parametrize("name", list(CODE_FORGERIES))
def test_an_object_of_the_code_cannot_answer_for_the_test(forgery_workspace, name, tmp_path):
    """The same wrong value as the honest wrong patch, dressed to answer the test's comparison
    itself (in plain pytest, in process, each of these passes at least one hidden test): every
    hidden test still fails, as the honest wrong patch's do."""
    assert plain_pytest_passes(CODE_FORGERIES[name], tmp_path) > 0
    forged = score_patch(forgery_workspace, diff("shapes.py", SHAPES, CODE_FORGERIES[name]), FORGERY_HIDDEN)
    assert forged.applies, forged
    assert forged.hidden is not None, forged
    assert (forged.hidden.passed, forged.hidden.failed) == (0, FORGERY_TESTS), forged.hidden


BOXES = textwrap.dedent(
    """
    class Box:
        def __init__(self, n):
            self.n = n

        def __eq__(self, other):
            return self.n == other.n


    def add(a, b):
        return a + b
    """
)


@needs_sandbox
def test_the_plans_sample_is_drawn_again_while_too_few_of_its_tests_cross(tmp_path, traversable_dir):
    """60 pass-to-pass tests, of which 6 can cross the boundary (the rest compare two objects of
    the code): the first draw of 24 holds few of the 6, so the plan draws again from the rest
    until every one that can cross has (before, only those of the first 24 were its sample)."""
    from fleet_pipelines.workspace import runs

    crossing = [f"def test_add_{i}():\n    assert add({i}, 1) == {i + 1}\n" for i in range(6)]
    opaque = [f"def test_box_{i}():\n    assert Box({i}) == Box({i})\n" for i in range(54)]
    tests = "from boxes import Box, add\n\n\n" + "\n\n".join(crossing + opaque)
    source = make_repo(tmp_path / "src", {"boxes.py": BOXES, "tests/test_boxes.py": tests})
    workspace = prepare_workspace("sample", RepoSpec(url=str(source)), traversable_dir / "ws")
    comment = diff("boxes.py", BOXES, BOXES.replace("class Box:", "class Box:  # a comment"))
    evidence = score_patch(workspace, comment, "")
    assert evidence.tests is not None and evidence.tests.status == "passed", evidence.tests
    plan = runs._PLANS[runs._plan_key(workspace, "")]
    assert sorted(plan.crossable) == sorted(f"tests/test_boxes.py::test_add_{i}" for i in range(6))


INPLACE = textwrap.dedent(
    """
    def normalize(items):
        items.sort()


    def memo(cache):
        def twice(x):
            if x not in cache:
                cache[x] = x * 2
            return cache[x]

        return twice
    """
)
INPLACE_HIDDEN = textwrap.dedent(
    """
    from inplace import memo, normalize


    def test_normalize_sorts_and_drops_duplicates_in_place():
        items = [3, 1, 3, 2]
        assert normalize(items) is None
        assert items == [1, 2, 3]


    def test_the_cache_is_the_callers():
        cache = {}
        twice = memo(cache)
        assert twice(2) == 4 and cache == {2: 4}
        cache[5] = 0  # the caller's entry: the code sees it
        assert twice(5) == 0
    """
)


@needs_sandbox
def test_a_hidden_test_reads_what_the_code_changed_in_its_containers(tmp_path, traversable_dir):
    """A hidden test that hands the code a list to change in place and a dict to fill judges the
    fix (both pass) and the comment patch (the in-place one fails): the tests' containers are the
    code's by reference. As copies, both failed on every patch, so no fix could pass the gate."""
    source = make_repo(
        tmp_path / "src", {"inplace.py": INPLACE, "tests/test_inplace.py": "def test_x():\n    pass\n"}
    )
    workspace = prepare_workspace("inplace", RepoSpec(url=str(source)), traversable_dir / "ws")
    fix = diff("inplace.py", INPLACE, INPLACE.replace("items.sort()", "items[:] = sorted(set(items))"))
    fixed = score_patch(workspace, fix, INPLACE_HIDDEN)
    assert fixed.hidden is not None and (fixed.hidden.passed, fixed.hidden.failed) == (2, 0), fixed.hidden
    comment = diff("inplace.py", INPLACE, INPLACE.replace("def memo", "# memo\ndef memo"))
    unfixed = score_patch(workspace, comment, INPLACE_HIDDEN)
    assert unfixed.hidden is not None and unfixed.hidden.failing == [
        "test_fleet_hidden.py::test_normalize_sorts_and_drops_duplicates_in_place"
    ], unfixed.hidden

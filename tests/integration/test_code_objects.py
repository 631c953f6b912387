"""Objects of the code under test cross the boundary as handles, and the tests' callables as
callbacks: a hidden test that builds an instance, iterates a generator, hands the code a lambda
or reads a namedtuple is judged, and the code still never receives what the test compares
against. Real git, real sandbox."""

from __future__ import annotations

import textwrap

import pytest

from fleet_pipelines.domain.models import RepoSpec
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
        assert log == []  # the code's list is its own: the tests' list crossed as a copy


    def test_equality_of_two_objects_of_the_code():
        assert Version(2) == Version.parse("2.0")
    """
)
FIX = diff("shapes.py", SHAPES, SHAPES.replace("Version(self.major + 1, self.minor)", "Version(self.major + 1, 0)"))
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
    assert unfixed.hidden is not None and (unfixed.hidden.passed, unfixed.hidden.failed) == (1, 1), unfixed.hidden
    assert unfixed.hidden.failing == ["test_fleet_hidden.py::test_bump"]

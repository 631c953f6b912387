"""The repository verdict's pure parts: what a patch is flagged for, what counts (the plan on the
base commit), how a session's outcomes are counted, the checks and the decision they give, and
the boundary between the tests and the code under test (its code process, run here for real)."""

from __future__ import annotations

import collections
import copy
import datetime
import decimal
import fractions
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import typing
import warnings
from pathlib import Path

import pytest

from fleet_pipelines.domain.decision import Decision, repository_verdict
from fleet_pipelines.domain.models import Task
from fleet_pipelines.domain.scoring import CheckResult, ProposalScore, gate_failures
from fleet_pipelines.domain.workspace import (
    FailToPass,
    PatchEvidence,
    TestEvidence,
    Workspace,
    excerpt,
    patch_flags,
)
from fleet_pipelines.scoring.patch import evidence_checks
from fleet_pipelines.workspace import boundary
from fleet_pipelines.workspace.runs import (
    TestPlan,
    counted_evidence,
    hidden_test_ids,
    pass_to_pass_evidence,
    pytest_args,
)

WIRE = Path(boundary.__file__).parents[1] / "sandbox" / "init.py"
STDLIB = frozenset(sys.stdlib_module_names)


def test_what_a_patch_touches_that_judges_it_is_flagged():
    flags = patch_flags(
        [
            "calc.py",
            "tests/test_calc.py",
            "conftest.py",
            "pyproject.toml",
            "setup.cfg",
            "evilplug-1.0.dist-info/entry_points.txt",
            "x.egg-info/PKG-INFO",
            "fleet.pth",
            "pprint.py",
            "src/json/__init__.py",
            "sitecustomize.py",
            "pytest.py",
            "docs/pprint.md",
            "lib/pprint.py",
        ],
        "",
        STDLIB,
        pytest_config=["pyproject.toml"],
    )
    assert flags == [
        "tests/test_calc.py: test file",
        "conftest.py: conftest.py",
        "pyproject.toml: pytest configuration",
        "evilplug-1.0.dist-info/entry_points.txt: plugin entry points",
        "x.egg-info/PKG-INFO: plugin entry points",
        "fleet.pth: site configuration (.pth)",
        "pprint.py: named like the standard library's 'pprint'",
        "src/json/__init__.py: named like the standard library's 'json'",
        "sitecustomize.py: named like the test runner's or site's 'sitecustomize'",
        "pytest.py: named like the test runner's or site's 'pytest'",
    ]  # setup.cfg without a changed pytest section, docs and a module below a package: fine
    assert patch_flags(["pkg/pprint.py", "pkg/os.py"], "pkg", STDLIB) == [
        "pkg/pprint.py: named like the standard library's 'pprint'",
        "pkg/os.py: named like the standard library's 'os'",
    ]
    assert patch_flags(["other/os.py"], "pkg", STDLIB) == []


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("pytest", []),
        ("python -m pytest -q tests", ["-q", "tests"]),
        ("python3 -m pytest -x --maxfail=2 --lf -k add", ["-k", "add"]),
        ("/usr/bin/py.test --sw tests/unit", ["tests/unit"]),
        ("make test", None),
        ("python -m unittest", None),
        ("pytest 'unclosed", None),
    ],
)
def test_the_counted_session_takes_the_test_commands_pytest_arguments(command, args):
    assert pytest_args(command) == args


def test_the_hidden_tests_ids_are_read_from_their_source():
    source = textwrap.dedent(
        """
        import pytest
        def helper(): pass
        def test_a(): pass
        async def test_b(): pass
        class TestC:
            def test_d(self): pass
            def other(self): pass
        class Helper:
            def test_e(self): pass
        """
    )
    assert hidden_test_ids(source) == [
        "test_fleet_hidden.py::test_a",
        "test_fleet_hidden.py::test_b",
        "test_fleet_hidden.py::TestC::test_d",
    ]
    assert hidden_test_ids("def broken(:") == []


def session(results: dict[str, str], **extra) -> dict:
    return {
        "results": {i: {"outcome": o, "detail": f"why {i}"} for i, o in results.items()},
        "done": True,
        **extra,
    }


def test_only_the_plans_tests_count_and_anything_but_a_pass_fails():
    plan = {"t::ok": "boundary", "t::skip": "boundary", "t::err": "boundary", "t::gone": "boundary"}
    plan["t::obj"] = "cannot_cross"  # could not cross on the base: left out, whatever the patch does
    outcomes = {"t::ok": "passed", "t::skip": "skipped", "t::err": "failed", "t::obj": "passed"}
    outcomes |= {f"t::added_{i}": "passed" for i in range(300)}  # the patch's own: not counted
    evidence = counted_evidence(plan, session(outcomes), "ran", 10)
    assert (evidence.passed, evidence.failed, evidence.status) == (1, 3, "failed")
    assert evidence.failing == ["t::skip", "t::err", "t::gone"] and evidence.cannot_cross == ["t::obj"]
    assert evidence.not_counted == 300 and evidence.first_failure == "t::skip: skipped\nwhy t::skip"
    gone = counted_evidence({"t::a": "boundary"}, session({}, collect_errors=[["t", "ImportError"]]), "r", 1)
    assert gone.first_failure == "t::a: not reported\ncollecting t failed:\nImportError"
    assert counted_evidence({"t::a": "boundary"}, session({"t::a": "passed"}), "r", 1).status == "passed"
    assert counted_evidence({"t::a": "boundary"}, {"timeout": True}, "r", 3).status == "timeout"
    assert counted_evidence({"t::a": "boundary"}, {"results": {}}, "r", 3).status == "error"
    assert counted_evidence({}, session({"x": "passed"}), "r", 3).status == "failed"
    unjudged = counted_evidence({"t::obj": "cannot_cross"}, session({"t::obj": "failed"}), "r", 3)
    assert (unjudged.total, unjudged.status, unjudged.cannot_cross) == (0, "failed", ["t::obj"])


def plan_of(
    base: dict[str, str], crossable: tuple[str, ...] = (), flaky: frozenset = frozenset()
) -> TestPlan:
    return TestPlan(["tests"], base, crossable, {}, flaky)


def plain(outcomes: dict[str, str], **extra) -> dict:
    return {"outcomes": outcomes, "ran": "plain", "timeout": False, "output": "", "duration_s": 1.0, **extra}


def test_pass_to_pass_tests_count_like_swe_bench():
    base = {"t::a": "passed", "t::b": "passed", "t::fail": "failed", "t::skip": "skipped", "t::xf": "xfailed"}
    plan = plan_of(base)
    assert plan.passing == ["t::a", "t::b"]
    # a no-op: the base's failures, skips and xfails neither help nor hurt
    noop, found = pass_to_pass_evidence(plan, {"plain": plain(base)}, 10)
    assert (noop.passed, noop.failed, noop.status, noop.not_counted, found) == (
        2,
        0,
        "passed",
        3,
        plan,
    )
    assert noop.rests_on == "2 pass-to-pass in plain pytest"
    # a regression fails; a test the patch added is not counted; fixing a base failure does not help
    after = base | {"t::b": "failed", "t::fail": "passed", "t::new": "passed"}
    broken, _ = pass_to_pass_evidence(plan, {"plain": plain(after)}, 10)
    assert (broken.passed, broken.failed, broken.failing, broken.not_counted) == (1, 1, ["t::b"], 4)
    assert broken.first_failure == "t::b: failed"
    # a regression whose base outcome differs when run again there is flaky: listed, left out
    again = {"plain": plain(after), "base_recheck": plain({"t::b": "failed"})}
    shaky, found = pass_to_pass_evidence(plan, again, 10)
    assert (shaky.passed, shaky.failed, shaky.flaky, found.flaky) == (1, 0, ["t::b"], frozenset({"t::b"}))
    later, _ = pass_to_pass_evidence(found, {"plain": plain(after)}, 10)
    assert (later.passed, later.failed) == (1, 0)  # the plan keeps it out
    gone, _ = pass_to_pass_evidence(plan, {"plain": plain({}, timeout=True)}, 10)
    assert (gone.status, gone.failed) == ("timeout", 2)


def test_the_failing_tests_a_task_names_count_across_the_boundary():
    base = {"t::a": "passed", "t::test_add": "failed", "t::test_sub[1]": "failed", "t::other": "failed"}
    plan = plan_of(base)
    named = FailToPass("t::test_add fails: fix add", ("test_sub",))
    assert named.among(plan.failing) == ["t::test_add", "t::test_sub[1]"]
    assert FailToPass("fix calc.test_add_all").among(plan.failing) == []  # a word, not a part of one
    in_class = ["t.py::ChunkedEvenTests::test_5", "t.py::Other::test_5"]
    assert FailToPass("ChunkedEvenTests fail").among(in_class) == ["t.py::ChunkedEvenTests::test_5"]
    assert FailToPass("t.py is broken").among(in_class) == []  # a file names none of its tests
    # a no-op: the named failures count as failing; the other base failure neither helps nor hurts
    noop, _ = pass_to_pass_evidence(plan, {"plain": plain(base)}, 10, named)
    assert (noop.passed, noop.failed, noop.status, noop.fail_to_pass, noop.not_counted) == (
        1,
        2,
        "failed",
        2,
        1,
    )
    assert noop.first_failure == "t::test_add (named by the task, failing on the base): not reported"
    # only the boundary's pass counts: a plain pass of a named test is the code's own report
    crossed = {
        "t::test_add": {"outcome": "passed", "detail": ""},
        "t::test_sub[1]": {"outcome": "failed", "detail": "x"},
    }
    after = base | {"t::test_add": "passed", "t::test_sub[1]": "passed", "t::other": "passed"}
    fixed, _ = pass_to_pass_evidence(
        plan, {"plain": plain(after), "visible": {"results": crossed}}, 10, named
    )
    assert (fixed.passed, fixed.failed, fixed.fail_to_pass_passed, fixed.base_failing) == (2, 1, 1, 1)
    assert fixed.failing == ["t::test_sub[1]"]
    assert fixed.rests_on == "1 pass-to-pass in plain pytest; 2 fail-to-pass across the boundary"


def test_a_plain_report_the_boundary_contradicts_is_not_trusted():
    base = {f"t::{i}": "passed" for i in range(10)}
    plan = plan_of(base, crossable=("t::0", "t::1"))
    forged = {"plain": plain(base), "visible": session({"t::0": "passed", "t::1": "failed"})}
    evidence, _ = pass_to_pass_evidence(plan, forged, 10)
    assert evidence.contradicted == ["t::1"] and (evidence.passed, evidence.failed) == (1, 9)
    assert evidence.first_failure.startswith("the plain report says t::1 passed; across the boundary")
    honest = {"plain": plain(base), "visible": session({"t::0": "passed", "t::1": "cannot_cross"})}
    evidence, _ = pass_to_pass_evidence(plan, honest, 10)  # could not cross now: the plain report stands
    assert (evidence.passed, evidence.failed, evidence.contradicted) == (10, 0, [])
    assert evidence.rests_on == "10 pass-to-pass in plain pytest, 1 of them re-run across the boundary"
    outside = {"plain": plain(base), "visible": session({"t::5": "failed"})}  # not the plan's sample
    assert pass_to_pass_evidence(plan, outside, 10)[0].failed == 0  # (only a crossable test can tell)
    alone = {"t::1": session({"t::1": "passed"})}  # run again alone, it passes: the session's order did it
    evidence, _ = pass_to_pass_evidence(plan, {**forged, "visible_again": alone}, 10)
    assert (evidence.passed, evidence.contradicted) == (10, [])
    again = {"t::1": session({"t::1": "failed"})}
    assert pass_to_pass_evidence(plan, {**forged, "visible_again": again}, 10)[0].contradicted == ["t::1"]
    # alone on the base it passes: the boundary can judge it, so the contradiction stands
    judged = {**forged, "visible_again": again, "visible_base": {"t::1": session({"t::1": "passed"})}}
    evidence, found = pass_to_pass_evidence(plan, judged, 10)
    assert (evidence.contradicted, evidence.passed, found.crossable) == (["t::1"], 1, ("t::0", "t::1"))
    # it fails alone on the base too (chance, not the patch): its plain pass counts, it leaves the sample
    chance = {**judged, "visible_base": {"t::1": session({"t::1": "failed"})}}
    evidence, found = pass_to_pass_evidence(plan, chance, 10)
    assert (evidence.contradicted, evidence.passed, evidence.failed) == ([], 10, 0)
    assert evidence.rests_on == "10 pass-to-pass in plain pytest, 1 of them re-run across the boundary"
    assert found.crossable == ("t::0",)
    regressed = {**chance, "plain": plain(base | {"t::1": "failed"})}  # a plain failure still fails
    assert pass_to_pass_evidence(plan, regressed, 10)[0].failing == ["t::1"]
    failing = {"plain": plain(base | {"t::0": "failed"}), "visible": session({"t::0": "passed"})}
    evidence, _ = pass_to_pass_evidence(plan, failing, 10)  # the boundary never rescues a plain failure
    assert (evidence.passed, evidence.failing) == (9, ["t::0"])


WORKSPACE = Workspace(task_id="t", path="/ws", commit="c" * 40, test_command="pytest")
TASK = Task.from_fields("t", {"description": "Fix add.", "role": "DEV", "tests": "def test_x(): pass"})


def counted(passed: int, failed: int) -> TestEvidence:
    status = "passed" if not failed else "failed"
    return TestEvidence(status=status, ran="r", passed=passed, failed=failed, counted=True)


def test_the_checks_count_the_boundary_and_never_pass_a_forgeable_result():
    honest = PatchEvidence(applies=True, changed_files=["calc.py"], tests=counted(2, 0), hidden=counted(2, 0))
    checks = {c.name: c for c in evidence_checks(WORKSPACE, TASK, True, honest)}
    assert checks["tests"].value == 1.0 and checks["patch_scope"].value == 1.0
    assert not checks["tests"].forgeable
    flagged = honest.model_copy(update={"flags": ["tests/test_calc.py: test file"]})
    checks = {c.name: c for c in evidence_checks(WORKSPACE, TASK, True, flagged)}
    assert (
        checks["patch_scope"].value == 0.0
        and "tests/test_calc.py: test file" in checks["patch_scope"].evidence
    )
    in_process = TestEvidence(status="passed", ran="make test", forgeable=True)
    alone = PatchEvidence(applies=True, tests=in_process)
    check = next(c for c in evidence_checks(WORKSPACE, TASK, True, alone) if c.name == "tests")
    assert check.value == 1.0 and check.forgeable and "forgeable" in check.evidence
    score = ProposalScore(agent_id="a", score=1.0, checks=[check], requirements=[], code_blocks=1)
    assert gate_failures(score)[0].startswith("tests forgeable (ran in the process of the code it judges)")
    with_hidden = alone.model_copy(update={"hidden": counted(1, 1)})  # the in-process pass never counts
    check = next(c for c in evidence_checks(WORKSPACE, TASK, True, with_hidden) if c.name == "tests")
    assert check.value == 0.5 and not check.forgeable


def test_a_pass_needs_judged_hidden_tests_and_an_empty_patch_is_scored():
    unjudged = TestEvidence(
        status="failed", ran="r", counted=True, cannot_cross=["test_fleet_hidden.py::test_x"]
    )
    evidence = PatchEvidence(applies=True, tests=counted(5, 0), hidden=unjudged)
    check = next(c for c in evidence_checks(WORKSPACE, TASK, True, evidence) if c.name == "tests")
    assert check.value is None and check.evidence.startswith("none of the task's hidden tests can be judged")
    score = ProposalScore(agent_id="a", score=1.0, checks=[check], requirements=[], code_blocks=1)
    assert gate_failures(score)[0].startswith("tests: none of the task's hidden tests can be judged")
    empty = PatchEvidence(applies=True, tests=counted(5, 0), hidden=counted(0, 1))
    checks = {c.name: c for c in evidence_checks(WORKSPACE, TASK, False, empty)}
    assert checks["patch_applies"].evidence == "no change proposed: cccccccccccc scored as it is"
    assert checks["tests"].value == round(5 / 6, 4)


def test_evidence_text_keeps_its_head_and_tail():
    text = "cause\n" + "x" * 5_000 + "\nlast frame"
    cut = excerpt(text, 1_500)
    assert len(cut) < 1_510 and cut.startswith("cause\n") and cut.endswith("\nlast frame")
    assert excerpt("short", 10) == "short"


def scored(agent: str, applies: float, tests: float | None, forgeable: bool = False) -> ProposalScore:
    checks = [CheckResult(name="patch_applies", value=applies, evidence=f"{agent} applies={applies}")]
    if tests is not None:
        checks.append(CheckResult(name="tests", value=tests, evidence=f"{tests} pass", forgeable=forgeable))
    return ProposalScore(agent_id=agent, score=0.5, checks=checks, requirements=[], code_blocks=1)


def decision(winner: str | None = "a1") -> Decision:
    return Decision(
        status="COMPLETED",
        winner_id=winner,
        ranking=[],
        reasons=[f"{winner} ranked first with score 0.500"],
        quorum=1,
        usable_agents=2,
        failed_agents=[],
        timed_out_agents=[],
    )


def test_the_decision_says_plainly_when_no_patch_applied_or_passed():
    none_applied = repository_verdict(
        decision(), [scored("a1", 0.0, 0.0), scored("a2", 0.0, 0.0)], "p", "c" * 40
    )
    assert none_applied.reasons[0].startswith("no candidate's patch applied to cccccccccccc")
    assert "a1: a1 applies=0.0" in none_applied.reasons[0] and none_applied.winner_patch == ""
    none_passed = repository_verdict(decision(), [scored("a1", 1.0, 0.25), scored("a2", 1.0, 0.5)], "p", "c")
    assert none_passed.reasons[0].startswith(
        "no candidate's patch passed the tests: the best, a2's, scored 0.50"
    )
    assert none_passed.winner_patch == "p" and none_passed.base_commit == "c"
    forged = repository_verdict(decision(), [scored("a1", 1.0, 1.0, forgeable=True)], "p", "c")
    assert forged.reasons[0].startswith("no candidate's patch passed the tests")
    assert forged.reasons[-1].startswith("a1's tests result is forgeable")
    fine = repository_verdict(decision(), [scored("a1", 1.0, 1.0), scored("a2", 0.0, 0.0)], "p", "c")
    assert fine.winner_patch == "p"
    assert fine.reasons == ["a1 ranked first with score 0.500", "a1's tests pass on this evidence: 1.0 pass"]
    unchecked = scored("a1", 0.0, None).model_copy(
        update={"checks": [CheckResult(name="patch_applies", value=None, evidence="x", not_run=True)]}
    )
    assert repository_verdict(decision(), [unchecked], "p", "c").winner_patch == "p"  # said elsewhere


@pytest.fixture
def code(tmp_path: Path):
    """A boundary to a code process on a small repository (no sandbox: the wire and its rules)."""
    (tmp_path / "calc.py").write_text(
        textwrap.dedent(
            """
            import os
            CONSTANT = [1, 2]
            OBJECT = object()

            class Always(int):
                def __eq__(self, other):
                    return True

            def add(a, b):
                return a + b

            def liar(a, b):
                return Always(a + b)

            def fails():
                raise KeyError("no")

            class ParseError(ValueError):
                pass

            def parse(text):
                error = ParseError(f"bad {text}")
                error.text = text
                raise error

            def where():
                return os.getcwd()
            """
        )
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub.py").write_text("VALUE = 3\n")
    wire = boundary.load_wire(str(WIRE))
    env = {"PATH": os.environ["PATH"]}
    source = Path(boundary.__file__).read_text()
    side = boundary.Boundary(wire, str(WIRE), source, [str(tmp_path)], str(tmp_path), env)
    yield wire, side
    if side.sock is not None:
        side.sock.close()
        os.waitpid(side.pid, 0)


def test_plain_data_crosses_by_value_and_objects_of_the_code_as_handles(code):
    wire, side = code
    side.request(["import", "calc"])
    add = side.request(["get", "calc:add"])
    assert add(2, 3) == 5 and type(add(2, 3)) is int and add.__name__ == "add"
    assert side.request(["get", "calc:CONSTANT"]) == [1, 2]
    liar = side.request(["get", "calc:liar"])(1, 2)  # an int subclass: compared by the int it holds
    assert isinstance(liar, boundary.Handle) and liar == 3 and liar != 4
    assert liar + 1 == 4 and hash(liar) == hash(3) and int(liar) == 3 and liar in {3}
    opaque = side.request(["get", "calc:OBJECT"])
    with pytest.raises(wire.NotPlainData, match=r"== with a builtins\.object of the code under test"):
        _ = opaque == 1
    with pytest.raises(KeyError, match="no") as raised:
        side.request(["get", "calc:fails"])()
    assert raised.value.args == ("no",) and str(raised.value) == "'no'"  # as the code raised it
    with pytest.raises(wire.NotPlainData, match="a object of the tests cannot be passed"):
        add(object(), 1)
    with pytest.raises(AttributeError):
        side.request(["get", "calc:missing"])
    assert side.request(["get", "calc:where"])() == side.cwd
    parse_error = side.request(["get", "calc:ParseError"])  # the repository's exception class crosses
    assert issubclass(parse_error, ValueError) and parse_error is side.request(["get", "calc:ParseError"])
    with pytest.raises(parse_error, match="bad x") as raised:
        side.request(["get", "calc:parse"])("x")
    assert raised.value.text == "x" and raised.value.args == ("bad x",)  # its attributes cross


OBJECTS = """
import collections
import collections.abc
import contextlib
import dataclasses
import enum
import sys
import warnings

SEEN = []
Pair = collections.namedtuple("Pair", "a b")


class Meter:
    def __init__(self, start=0):
        self.value = start

    def add(self, n):
        self.value += n
        return self

    def __eq__(self, other):
        SEEN.append(other)
        return True

    def __lt__(self, other):
        SEEN.append(other)
        return True

    def __contains__(self, item):
        SEEN.append(item)
        return True

    def __radd__(self, other):
        SEEN.append(other)
        return other

    def __bool__(self):
        return self.value > 0

    def __len__(self):
        return self.value

    def __str__(self):
        return f"meter at {self.value}"

    def __deepcopy__(self, memo):
        return Meter(self.value + 100)

    def stop(self, item):
        raise StopIteration("over")


def seen():
    return list(SEEN)


class Bag:
    def __init__(self, *items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


class Base:
    KIND = "base"

    def __init__(self, size=1):
        self.size = size

    @classmethod
    def make(cls):
        return cls()

    def describe(self):
        return f"{self.KIND} of {self.size}"

    def doubled(self):
        return self.twice()  # a method the tests' class gives


def made_by_code(cls):
    return cls(5)


class Lookup(collections.abc.Mapping):
    def __init__(self, data):
        self.data = data

    def __getitem__(self, key):
        SEEN.append(key)
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class OldWarning(DeprecationWarning):
    pass


def old(x):
    import logging

    logging.getLogger("objects.old").info("old(%s) at info", x)
    logging.getLogger("objects.old").warning("old(%s) called", x)
    warnings.warn("old() is going", OldWarning)
    warnings.warn("plain", UserWarning)
    print("printed", x)
    print("to stderr", file=sys.stderr)
    return x


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: tuple
    note: str = dataclasses.field(default="", compare=False)

    def __post_init__(self):
        MADE.append(self)

    def moved(self, dx):
        return Point(self.x + dx, self.y)


MADE = []


def forged(text):  # a forgery: every point made so far becomes the last one made
    for point in MADE:
        object.__setattr__(point, "x", MADE[-1].x)
    return text


@dataclasses.dataclass(frozen=True)
class Labelled(Point):
    label: str = "l"


@dataclasses.dataclass
class Mutable:
    x: int


@dataclasses.dataclass(frozen=True, eq=False)
class Loose:
    x: int

    def __eq__(self, other):
        SEEN.append(other)
        return True


@dataclasses.dataclass(frozen=True)
class Shape:
    corner: Point


def decorate(cls):  # attrs' way: a decorator of the code takes a class of the tests
    cls.decorated = [name for name in vars(cls) if not name.startswith("__")]
    return cls


class Invalid(ValueError):
    pass


def validated(check, value):
    try:
        check(value)
    except Invalid as exc:
        return f"invalid: {exc.args[0]}"
    return "valid"


class Rule:  # pyparsing's way: operators between its objects build new ones
    def __init__(self, text):
        self.text = text

    def __add__(self, other):
        SEEN.append(other if not isinstance(other, Rule) else "a rule")
        return Rule(f"{self.text} {other.text}") if isinstance(other, Rule) else Rule(f"{self.text} {other}")

    def __ilshift__(self, other):
        self.text = f"<{other.text}>"
        return self

    def __invert__(self):
        return Rule(f"not {self.text}")

    def __neg__(self):
        return -len(self.text)


def favourite():
    return Color.RED


def count(n):
    yield from range(n)


def apply(function, *args, **kwargs):
    return function(*args, **kwargs)


def total(items):
    return sum(items)


def shift(day, delta):
    return day + delta


class Count(int):
    def __sub__(self, other):
        return Count(int(self) - other)


def sort_in_place(items):
    items.sort()


HELD = []


def hold(lists):
    HELD.append(lists)


def held():
    return [len(items) for items in HELD[-1]]


def sort_all(lists, key=None):
    for items in lists:
        items.sort(key=key)


def remember(store):
    def put(key, value):
        store[key] = value
        return len(store)

    return put


def same(value):
    return value


def swallow(function):
    try:
        function()
    except BaseException as exc:
        return type(exc).__name__


def walk(function):
    return [hasattr(function, name) for name in ("__globals__", "__code__", "__closure__", "__self__")]


def shape(function):
    import inspect

    return [function.__name__, str(inspect.signature(function))]


@contextlib.contextmanager
def suppressing(log):
    try:
        yield
    except BaseException as exc:
        SEEN.append(repr(exc))
"""


def test_objects_of_the_code_are_used_in_their_process_and_compared_in_the_tests(code):
    """Attributes, calls, iteration, len, str, copies and context managers go to the code's
    process; every comparison, membership and arithmetic with an operand of the tests happens in
    the tests, on a plain value: the code's operators never see the tests' values."""
    wire, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    meter, seen = side.request(["get", "objects:Meter"]), side.request(["get", "objects:seen"])
    m = meter(2).add(3)
    assert isinstance(m, boundary.Handle) and m.value == 5 and str(m) == "meter at 5" and len(m) == 5 and m
    assert m.__module__ == "objects" and meter.__name__ == "Meter" and m.__doc__ is None
    assert isinstance(m, meter) and not isinstance(5, meter) and f"{m}" == "meter at 5"
    for compare in (lambda: m == 5, lambda: m < 9, lambda: 5 in m, lambda: 7 + m, lambda: m == meter(5)):
        with pytest.raises(wire.NotPlainData, match="holds no plain value"):
            compare()
    bag, lookup = side.request(["get", "objects:Bag"]), side.request(["get", "objects:Lookup"])
    assert "a" in bag(1, "a") and 2 not in bag(1, "a") and m in bag(m)  # iterated here, as Python does
    assert "k" in lookup({"k": 1}) and "x" not in lookup({"k": 1})  # a Mapping mixin's: by its keys
    assert 3 in side.request(["get", "objects:count"])(5)  # a generator: consumed as Python would
    with pytest.raises(wire.NotPlainData, match="decides membership itself"):
        _ = 5 in m  # Meter's own __contains__ would be handed 5
    assert seen() == []  # not one of the tests' operands reached the code

    class Helper:
        pass

    class Mixed(side.request(["get", "objects:Base"]), Helper):  # a class of the tests
        @classmethod  # among its bases: defined, not usable
        def parse(cls):
            return super().make()

    assert Mixed.__name__ == "Mixed" and getattr(Mixed, "setup_class", None) is None  # pytest's probes
    for use in (Mixed, lambda: Mixed.KIND, lambda: Mixed.make, Mixed.parse):
        with pytest.raises(wire.NotPlainData, match=r"tests derives from a class objects\.Base"):
            use()
    assert {m: 1}[m] == 1 and {meter: 2}[meter] == 2  # hashed by identity: no plain value
    color = side.request(["get", "objects:Color"])
    assert side.request(["get", "objects:favourite"])() == color.RED  # one object: equal to itself
    with pytest.raises(wire.NotPlainData, match="holds no plain value"):
        _ = color.RED == color.BLUE  # two objects of the code: their own __eq__ would decide
    assert copy.deepcopy(m).value == 105  # the code's own copy, made in its process
    with pytest.raises(wire.NotPlainData, match="cannot be pickled by the tests"):
        pickle.dumps(m)
    pair = side.request(["get", "objects:Pair"])(1, [2])
    assert pair == (1, [2]) and pair.b == [2] and list(pair) == [1, [2]] and pair[0] == 1
    assert isinstance(pair, tuple) and type(pair) is boundary.Handle and not isinstance(m, tuple)
    assert side.request(["get", "objects:Pair"])(0.1 + 0.2, 1) == pytest.approx((0.3, 1))
    assert list(side.request(["get", "objects:count"])(3)) == [0, 1, 2]
    generator = side.request(["get", "objects:count"])(1)
    assert next(generator) == 0
    with pytest.raises(StopIteration):  # the iteration said it is over: the tests' own end
        next(generator)
    with pytest.raises(RuntimeError, match="StopIteration raised in the code under test"):
        all(map(m.stop, [1]))  # a StopIteration of the code never ends the tests' iteration
    with side.request(["get", "objects:suppressing"])([]):
        pass
    with pytest.raises(AssertionError), side.request(["get", "objects:suppressing"])([]):
        raise AssertionError("expected 42")  # never suppressed; the code gets the class only
    assert seen() == ["AssertionError()"]


def test_a_class_of_the_tests_deriving_from_the_codes_is_made_by_the_code_and_its_methods_run_here(code):
    """marshmallow's tests derive their schemas and fields from its classes: the class is made in
    the code process, its methods are the tests' (called back, the instance a handle whose class
    here makes super() work), and it is made again in a fresh code process."""
    wire, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    ran = []

    class Sub(side.request(["get", "objects:Base"])):
        KIND = "sub"

        class Meta:  # a plain nested class: made in the code process too
            fields = ("size",)

        def __init__(self, size=2):
            ran.append(size)
            super().__init__(size * 10)

        def twice(self):
            return self.size * 2

        def describe(self):
            return "the " + super().describe()

        @classmethod
        def parse(cls):
            return super().make()

        @property
        def half(self):
            return self.size / 2

    class Deeper(Sub):  # from a class the tests derived: super() reaches each level
        def describe(self):
            return "deeper: " + super().describe()

    schema = Sub(4)  # a module-level object, as a hidden test's module holds it
    side.collected = True  # the test module is imported: the tests run
    sub = Sub(3)
    assert isinstance(sub, boundary.Handle) and isinstance(sub, Sub) and sub.size == 30 and ran == [4, 3]
    assert sub.describe() == "the sub of 30" and sub.doubled() == 60 and sub.half == 15  # doubled: twice()
    assert Sub.parse().size == 20 and Sub.Meta.fields == ("size",) and Sub.KIND == "sub"
    assert side.request(["get", "objects:made_by_code"])(Sub).describe() == "the sub of 50"
    assert Deeper(1).describe() == "deeper: the sub of 10"
    side.restart()  # each hidden test's fresh code process: the classes and the object are made again
    assert Sub(1).describe() == "the sub of 10" and Deeper(2).describe() == "deeper: the sub of 20"
    assert schema.size == 40
    with pytest.raises(wire.NotPlainData, match="holds no plain value"):
        _ = Sub(1) == Sub(1)  # still compared on the test side


def test_what_the_code_warns_prints_and_logs_reaches_pytest_warns_capsys_and_caplog(code, capsys, caplog):
    """marshmallow's deprecation tests: `pytest.warns(RemovedInMarshmallow4Warning)` around a call
    of the code. The warning is warned again in the test process, as the class the tests hold for
    the code's (`exception_class`) or as the builtin class; what the code printed is printed."""
    _, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    old_warning, old = side.request(["get", "objects:OldWarning"]), side.request(["get", "objects:old"])
    with pytest.warns(Warning) as caught:
        assert old(3) == 3
    assert [(type(w.message), str(w.message)) for w in caught] == [
        (old_warning, "old() is going"),
        (UserWarning, "plain"),
    ]
    assert issubclass(old_warning, DeprecationWarning) and caught[0].filename.endswith("objects.py")
    assert capsys.readouterr() == ("printed 3\n", "to stderr\n")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("objects.old", "WARNING", "old(3) called")  # info: below the root's level, as in one process
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="objects"), pytest.warns(Warning):
        old(5)
    assert [r.getMessage() for r in caplog.records] == ["old(5) at info", "old(5) called"]
    caplog.clear()
    apply = side.request(["get", "objects:apply"])
    with pytest.warns(Warning):  # old() asked for within a call back: its records once, not twice
        assert apply(lambda: old(6)) == 6
    assert [r.getMessage() for r in caplog.records] == ["old(6) called"]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a project's filterwarnings = error
        with pytest.raises(UserWarning, match="plain"), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            old(4)


def test_an_exception_of_the_codes_class_raised_by_the_tests_is_the_codes_own_there(code):
    """marshmallow's validators in the tests raise its `ValidationError`, which the code catches:
    the code raises its own class with the plain arguments. Any other exception reaches the code
    as its builtin class only, without its text."""
    _, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    invalid, validated = side.request(["get", "objects:Invalid"]), side.request(["get", "objects:validated"])

    class TooBig(invalid):  # a class of the tests deriving from it: the code's class crosses
        pass

    def check(value):
        if value > 3:
            raise invalid("too big")
        if value < 0:
            raise TooBig("below zero")

    def secret(value):
        raise KeyError("expected 42")

    assert validated(check, 5) == "invalid: too big" and validated(check, 1) == "valid"
    assert validated(check, -1) == "invalid: below zero"
    with pytest.raises(KeyError) as raised:
        validated(secret, 1)
    assert "expected 42" not in str(raised.value)


def test_two_frozen_objects_whose_equality_dataclasses_generated_compare_by_their_fields_here(code):
    """`Point.parse(s) == Point(1, 2)`: the generated `==` compares the fields' tuples of two
    objects of one exact class; here it is computed on the test side from the fields each object
    had as it crossed, so a class's own `__eq__` never runs (it would decide for the expected
    object too), and code that rewrites its earlier objects once the expected one is made
    changes nothing. Only frozen ones: a mutable object's fields are not known when compared."""
    wire, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    point, labelled = side.request(["get", "objects:Point"]), side.request(["get", "objects:Labelled"])
    assert point(1, (2,)) == point(1, (2,)) and point(1, (2,), note="a") == point(1, (2,), note="b")
    assert point(1, (2,)).moved(1) == point(2, (2,)) and point(1, (2,)) != point(1, (3,))
    assert point(1, (2,)) != labelled(1, (2,)) and labelled(1, (2,)) == labelled(1, (2,))  # exact class
    shape = side.request(["get", "objects:Shape"])
    assert shape(point(1, (2,))) == shape(point(1, (2,))) and shape(point(1, (2,))) != shape(point(0, (2,)))
    forged = side.request(["get", "objects:forged"])
    wrong = point(7, (2,))
    expected = point(1, (2,))
    forged("again")  # the code rewrites the wrong answer into the expected one, after both crossed
    assert wrong.x == 1 and wrong != expected  # as it crossed: 7
    loose, seen = side.request(["get", "objects:Loose"]), side.request(["get", "objects:seen"])
    mutable = side.request(["get", "objects:Mutable"])
    for pair in ((loose(1), loose(2)), (mutable(1), mutable(1)), (point(1, (2,)), (1, (2,)))):
        with pytest.raises(wire.NotPlainData, match="holds no plain value"):
            _ = pair[0] == pair[1]  # its own __eq__, a mutable object, a value of the tests: as before
    assert seen() == []


def test_a_plain_class_of_the_tests_handed_to_the_code_is_made_there(code):
    """attrs' tests put `@attr.s` on their own classes: the class is made in the code process
    from its namespace (its methods called back), so the decorator of the code works on it, and
    it is made again in a fresh code process (each hidden test's)."""
    _, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    side.tests_root = str(Path(__file__).parent)

    @side.request(["get", "objects:decorate"])
    class Plain:
        kind = "plain"

        def __init__(self, x):
            self.x = x

        def double(self):
            return self.x * 2

    assert isinstance(Plain, boundary.Handle) and Plain.decorated == ["kind", "double"]
    assert Plain(3).double() == 6 and Plain.kind == "plain"
    apply = side.request(["get", "objects:apply"])
    assert apply(repr, typing.ClassVar) == "typing.ClassVar"  # typing's own, by name: not a callback
    side.collected = True
    side.restart()
    assert Plain(4).double() == 8 and Plain.decorated == ["kind", "double"]


def test_arithmetic_of_objects_of_the_code_alone_is_the_codes_own(code):
    """`a + b`, `a <<= b` between two objects of the code and `~a` of one are computed by the code,
    as its methods are (pyparsing builds its grammars so): no value of the tests takes part. With
    an operand of the tests, the code's own arithmetic still never runs."""
    wire, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    rule, seen = side.request(["get", "objects:Rule"]), side.request(["get", "objects:seen"])
    both = rule("a") + rule("b")
    assert isinstance(both, boundary.Handle) and both.text == "a b" and (~both).text == "not a b"
    assert -both == -3  # a plain value the code computed from its object alone
    forward = rule("f")
    alias = forward
    forward <<= both  # in place, as the code's class does it: every name of the object sees it
    assert alias.text == "<a b>" and forward.text == "<a b>"
    for with_theirs in (lambda: rule("a") + ",", lambda: "(" + rule("a"), lambda: rule("a") < rule("b")):
        with pytest.raises(wire.NotPlainData, match="holds no plain value"):
            with_theirs()
    assert seen() == ["a rule"]  # the tests' "," and "(" never reached the code


def test_the_tests_callables_run_in_the_tests_with_only_what_the_code_passes(code):
    wire, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    apply = side.request(["get", "objects:apply"])
    got = []
    assert apply(lambda x, y=0: got.append((x, y)) or x * 2, 4, y=1) == 8 and got == [(4, 1)]
    assert apply(sorted, [3, 1]) == [1, 3]
    count = side.request(["get", "objects:Count"])(3)
    assert count == 3 and int(count) == 3 and count + 1 == 4  # its own +? none: int's, on the test side
    with pytest.raises(wire.NotPlainData, match="whose class computes - itself"):
        _ = count - 1  # the test side would compute an int where the code computes a Count
    shift = side.request(["get", "objects:shift"])  # the standard library's values cross by value
    day, utc = datetime.datetime(2024, 1, 1, 12, tzinfo=datetime.UTC), datetime.UTC
    assert shift(day, datetime.timedelta(days=1)) == datetime.datetime(2024, 1, 2, 12, tzinfo=utc)
    assert shift(decimal.Decimal("0.1"), decimal.Decimal("0.2")) == decimal.Decimal("0.3")
    assert shift(fractions.Fraction(1, 3), 1) == fractions.Fraction(4, 3) and apply(range, 3) == range(3)
    total = side.request(["get", "objects:total"])
    assert total(x * 2 for x in range(4)) == 12 and total(range(3)) == 3  # the tests' generator, a range
    assert total(collections.deque([1, 2])) == 3  # an iterable of the tests: iterated by call back
    with pytest.raises(wire.NotPlainData, match="a defaultdict of the tests cannot be passed"):
        total(collections.defaultdict(int))  # a container would be half of itself
    assert apply(side.request(["get", "objects:count"]), 2) is not None  # the code's own function, by name
    assert side.request(["get", "objects:walk"])(lambda: 1) == [False, False, False, False]

    def pick(a, b=42, *rest, key):
        return a

    name, signature = side.request(["get", "objects:shape"])(pick)  # names and kinds, no default's value
    assert name == "pick" and signature.startswith("(a, b=<object object at ") and "42" not in signature
    assert signature.endswith(", *rest, key)") and apply(int, "7") == 7  # a builtin class by name
    secret = "expected 42"

    def raises():
        raise ValueError(secret)

    assert side.request(["get", "objects:swallow"])(raises) == "ValueError"  # its class, not its text
    with pytest.raises(pytest.skip.Exception):  # pytest's outcome holds, whatever the code does with it
        side.request(["get", "objects:swallow"])(lambda: pytest.skip("later"))
    for refused in (exec, eval, open, getattr, os.system, subprocess.run):
        with pytest.raises(wire.NotPlainData, match="cannot be passed to the code under test"):
            apply(refused, "1")


def test_the_tests_containers_are_the_codes_by_reference(code):
    """A list, dict, set or bytearray of the tests that the code holds is one object as in plain
    Python: what the code changes in it is the test's after the call, what the test changes is
    the code's at its next request, and it comes back as itself; a container the code makes
    crosses as a copy."""
    _, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    sort_in_place, remember, same = (
        side.request(["get", f"objects:{n}"]) for n in ("sort_in_place", "remember", "same")
    )
    items, inner = [3, 1, 2], [9, 8]
    assert sort_in_place(items) is None and items == [1, 2, 3]
    outer = [inner, 0]
    sort_in_place(outer[0])
    assert outer[0] is inner and inner == [8, 9]
    first, second = [2, 1], [4, 3]  # containers inside a container: each numbered after it
    side.request(["get", "objects:sort_all"])([first, second], key=None)
    assert (first, second) == ([1, 2], [3, 4])
    pair = [first, second]
    side.request(["get", "objects:hold"])(pair)  # the code keeps the list and the two in it
    pair.append([5, 6, 7])
    first.append(0)
    assert side.request(["get", "objects:held"])() == [3, 2, 3]  # each change reached its own
    store = {}
    put = remember(store)  # the code keeps the test's dict and fills it on later calls
    assert put("a", 1) == 1 and store == {"a": 1}
    store["b"] = 2  # the test's change, seen by the code at its next request
    assert put("c", [3]) == 3 and store == {"a": 1, "b": 2, "c": [3]}
    looped = [1]
    looped.append(looped)
    assert same(items) is items and same(looped) is looped and same((items, 1))[0] is items
    assert same({1, 2}) == {1, 2} and same(bytearray(b"x")) == bytearray(b"x")
    seen = side.request(["get", "objects:seen"])
    made = seen()  # a list the code made: a copy, as before
    made.append("x")
    assert seen() == []


def test_a_handle_of_an_earlier_code_process_names_nothing_but_a_name_is_found_again(code):
    wire, side = code
    Path(side.cwd, "objects.py").write_text(OBJECTS)
    side.request(["import", "objects"])
    meter = side.request(["get", "objects:Meter"])
    m, kept = meter(1).add(2), meter(4)  # one changed after it was made (a method taken), one not
    side.restart()
    assert meter(7).value == 7  # the class, by its name, in the fresh process
    assert kept.value == 4  # made again, as it was made
    with pytest.raises(wire.NotPlainData, match="made for an earlier test"):
        _ = m.value


def test_the_tests_import_the_repository_as_proxies_they_cannot_change(code):
    wire, side = code
    finder = boundary.RepositoryFinder(side, ["calc", "pkg"])
    sys.meta_path.insert(0, finder)
    try:
        import calc  # type: ignore[import-not-found]
        from pkg.sub import VALUE  # type: ignore[import-not-found]

        assert isinstance(calc, boundary.RemoteModule) and calc.add(1, 2) == 3 and VALUE == 3
        with pytest.raises(wire.NotPlainData, match=r"setting calc\.add would change the tests' view only"):
            calc.add = lambda a, b: a + b  # monkeypatching a proxy would fool only the tests
        with pytest.raises(ImportError):
            from calc import missing  # type: ignore[import-not-found]  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
        for name in ("calc", "pkg", "pkg.sub"):
            sys.modules.pop(name, None)


def test_the_repository_never_shadows_the_standard_library_the_environment_or_the_tests(tmp_path: Path):
    repo = tmp_path / "repo"
    for package in ("pkg", "tests", "json", "data"):
        (repo / package).mkdir(parents=True)
    for name in ("calc.py", "pprint.py", "test_x.py", "conftest.py", "sitecustomize.py", "six.py"):
        (repo / name).write_text("")
    for name in ("pkg/__init__.py", "tests/test_a.py", "json/__init__.py"):
        (repo / name).write_text("")
    env = tmp_path / "env"
    env.mkdir()
    (env / "six.py").write_text("")
    names = boundary.repository_names([str(repo), str(repo / "src")], [str(env)], STDLIB)
    assert names == ["calc", "pkg"]


def test_the_job_finds_every_changed_path_and_a_changed_pytest_section(tmp_path: Path):
    import shutil

    from fleet_pipelines.workspace import sandbox_job

    base = tmp_path / "base"
    (base / "tests").mkdir(parents=True)
    for name, text in {
        "calc.py": "x\n",
        "tests/test_a.py": "t\n",
        "run.sh": "s\n",
        "setup.cfg": "[x]\n",
    }.items():
        (base / name).write_text(text)
    os.symlink("calc.py", base / "link")
    patched = tmp_path / "patched"
    shutil.copytree(base, patched, symlinks=True)  # as the job copies: modes and mtimes kept
    assert sandbox_job.changed_paths(str(base), str(patched)) == []
    (patched / "tests" / "test_a.py").rename(patched / "tests" / "test_b.py")  # a rename: both
    (patched / "run.sh").chmod(0o755)  # a mode change
    (patched / "link").unlink()
    os.symlink("run.sh", patched / "link")  # a link pointed elsewhere
    (patched / "calc.py").write_text("y\n")  # same size, new content
    assert sandbox_job.changed_paths(str(base), str(patched)) == [
        "calc.py",
        "link",
        "run.sh",
        "tests/test_a.py",
        "tests/test_b.py",
    ]
    config = tmp_path / "pyproject.toml"
    config.write_text('[project]\nname = "x"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n\n[tool.ruff]\n')
    assert sandbox_job.pytest_section(str(config)) == '[tool.pytest.ini_options]\naddopts = "-q"\n'
    assert sandbox_job.pytest_section(str(tmp_path / "none.cfg")) == ""


def test_the_plan_samples_the_projects_own_tests_of_what_the_hidden_tests_call():
    """The base's passing tests named after what the hidden tests import, those whose parameters
    hold the hidden tests' constants first, capped: crossed after every patch (the impossible
    task's forgery that answers otherwise only outside pytest is caught by them)."""
    from fleet_pipelines.workspace import sandbox_job

    passing = [f"test_inflection.py::test_ordinal[{n}-{n}th]" for n in range(30)] + [
        "test_inflection.py::test_ordinalize[13-13th]",
        "test_inflection.py::test_pluralize[word]",
        "boltons/strutils.py::boltons.strutils.camel2under",
        "tests/test_misc.py::test_ordinal_words",
    ]
    hidden = (
        "from inflection import ordinal\nfrom boltons.strutils import camel2under\n\n"
        "def test_x():\n    assert ordinal('13') == 'th'\n"
    )
    named = sandbox_job.named_ids(passing, hidden, 40)
    assert named[0] == "test_inflection.py::test_ordinal[13-13th]"
    assert "boltons/strutils.py::boltons.strutils.camel2under" in named
    assert "tests/test_misc.py::test_ordinal_words" in named  # `ordinal` as a word of its name
    assert "test_inflection.py::test_ordinalize[13-13th]" not in named  # another name
    assert "test_inflection.py::test_pluralize[word]" not in named
    assert len(sandbox_job.named_ids(passing, hidden, 5)) == 5
    assert sandbox_job.named_ids(passing, "from inflection import *\n", 5) == []
    assert sandbox_job.named_ids(passing, "not python (", 5) == []
    by_module = (  # the standard library's and pytest's names are none of the code's
        "import os\nimport pytest\nimport inflection\n\ndef test_x():\n"
        "    assert inflection.pluralize(os.path.basename('word')) == pytest.approx('words')\n"
    )
    assert sandbox_job.named_ids(passing, by_module, 5) == ["test_inflection.py::test_pluralize[word]"]
    # a constant of the hidden test as a word of a test's name ranks it first, past the cap's
    # parametrized ones (inflection's own one-off of pluralize('plurals') was passed by an
    # answer that differs only outside pytest while test_pluralize_plurals was not sampled)
    many = [f"test_inflection.py::test_pluralize_plural[w{n}-w{n}s]" for n in range(30)]
    many.append("test_inflection.py::test_pluralize_plurals")
    plurals = "import inflection\n\ndef test_x():\n    assert inflection.pluralize('plurals') == 'plurals!'\n"
    assert sandbox_job.named_ids(many, plurals, 24)[0] == "test_inflection.py::test_pluralize_plurals"


def test_a_projects_declared_test_dependencies_are_read_where_projects_write_them(tmp_path: Path):
    from fleet_pipelines.workspace.environment import declared_test_dependencies

    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent("""
        [project]
        name = "p"
        dependencies = ["attrs"]
        optional-dependencies = {tests = ["hypothesis>=6"], docs = ["sphinx"]}
        [dependency-groups]
        lint = ["ruff"]
        mocks = ["pytest-mock"]
        test = ["pytest>=7", {include-group = "mocks"}, "pytest-cov"]
        """)
    )
    (tmp_path / "setup.cfg").write_text("[options.extras_require]\ntesting = freezegun\n    pluggy\n")
    (tmp_path / "requirements-tests.txt").write_text("# pinned\nresponses==0.25.0\n-e .\n")
    (tmp_path.parent / "outside.txt").write_text("evil\n")
    (tmp_path / "tox.ini").write_text(
        "[testenv]\ndeps =\n    -r{toxinidir}/requirements-tests.txt\n    -r ../outside.txt\n    coverage\n"
        "    cov: pytest-cov\n    py38,!pypy: mock\n"
    )
    # the groups named test/tests/testing, include-group followed; pytest and what it requires
    # (pluggy) are the judge's own runner and never installed; a -r outside the project is not
    # read; tox's lines for named environments only (`cov: pytest-cov`) are not the test's
    assert declared_test_dependencies(tmp_path) == [
        "pytest-mock",
        "pytest-cov",
        "hypothesis>=6",
        "freezegun",
        "coverage",
        "responses==0.25.0",
    ]
    assert declared_test_dependencies(tmp_path / "missing") == []
    poetry = tmp_path / "poetry"
    poetry.mkdir()
    (poetry / "pyproject.toml").write_text(
        textwrap.dedent("""
        [tool.poetry.dependencies]
        python = "^3.8"
        [tool.poetry.group.dev.dependencies]
        pytest = "^7.2.0"
        PyYAML = "^6.0"
        mypy = "^0.990"
        Sphinx = "^4.3.2"
        [tool.poetry.dev-dependencies]
        freezegun = {version = "^1.0"}
        """)
    )
    # Poetry's groups by name (its ^ constraints are not PEP 440); tools no test imports left out
    assert declared_test_dependencies(poetry) == ["PyYAML", "freezegun"]
    pdm = tmp_path / "pdm"  # cattrs 24.1: PDM's dev-dependencies, its test group
    pdm.mkdir()
    (pdm / "pyproject.toml").write_text(
        '[tool.pdm.dev-dependencies]\nlint = ["ruff"]\n'
        'test = ["hypothesis>=6.79.4", "pytest>=7.4.0", "immutables"]\n'
    )
    assert declared_test_dependencies(pdm) == ["hypothesis>=6.79.4", "immutables"]


def test_a_projects_own_dependencies_are_read_from_setup_cfg_and_setup_pys_literal(tmp_path: Path):
    """asttokens 2.4.1 declares `six` in setup.cfg alone: its tests failed to import it."""
    from fleet_pipelines.workspace.environment import declared_dependencies

    (tmp_path / "setup.cfg").write_text(
        '[options]\ninstall_requires =\n    six >= 1.12.0\n    typing; python_version < "3.5"\n'
    )
    (tmp_path / "setup.py").write_text(
        "import setuptools\n\nsetuptools.setup(name='p', install_requires=['attrs>=20', 'six >= 1.12.0'])\n"
    )
    (tmp_path / "requirements.txt").write_text("PyYAML==6.0.1\n")
    assert declared_dependencies(tmp_path) == [
        "six >= 1.12.0",
        'typing; python_version < "3.5"',
        "attrs>=20",
        "PyYAML==6.0.1",
    ]
    # a computed list is never run: nothing is read from it
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\n\nsetup(install_requires=open('r').read())\n"
    )
    (tmp_path / "setup.cfg").unlink()
    assert declared_dependencies(tmp_path) == ["PyYAML==6.0.1"]


def test_the_environments_pytest_plugins_load_by_name_with_what_they_change_about_the_run_off(tmp_path: Path):
    from fleet_pipelines.workspace import sandbox_job

    for dist, points in (
        ("pytest_mock-3.14.0", "[pytest11]\npytest_mock = pytest_mock\n"),
        ("pytest_cov-6.0.0", "[pytest11]\npytest_cov = pytest_cov.plugin\n"),
        ("pytest_randomly-3.15.0", "[pytest11]\nrandomly = pytest_randomly\n"),
        ("pytest_xdist-3.6.1", "[pytest11]\nxdist = xdist.plugin\nxdist.looponfail = xdist.looponfail\n"),
        (
            "hypothesis-6.100.0",
            "[console_scripts]\nhypothesis = hypothesis.extra.cli:main\n"
            "[pytest11]\nhypothesispytest = _hypothesis_pytestplugin\n",
        ),
        ("attrs-24.2.0", ""),
    ):
        (tmp_path / f"{dist}.dist-info").mkdir()
        if points:
            (tmp_path / f"{dist}.dist-info" / "entry_points.txt").write_text(points)
    # coverage measured by nothing, xdist distributing nothing (their marks and fixtures stay),
    # randomly not loaded; deprecations of the judge's pytest and its plugins never errors
    assert sandbox_job.pytest_options(str(tmp_path)) == [
        *("-p", "_hypothesis_pytestplugin", "-p", "pytest_cov.plugin", "-p", "pytest_mock"),
        *("-p", "xdist.plugin", "-p", "xdist.looponfail", "--no-cov", "-n", "0"),
        *("-W", "ignore::pytest.PytestDeprecationWarning", "--continue-on-collection-errors"),
    ]
    assert sandbox_job.pytest_options(str(tmp_path / "none")) == [
        *sandbox_job.PYTEST_DEPRECATIONS,
        *sandbox_job.COLLECTION,
    ]


def test_a_plan_is_kept_when_only_the_samples_session_ended_at_its_budget():
    from fleet_pipelines.workspace.runs import _plan_done

    plain = {"timeout": False, "outcomes": {"t::a": "passed"}}
    cut = {"done": False, "timeout": True, "results": {"t::a": {"outcome": "passed"}}}
    assert _plan_done({"plan_plain": plain, "plan_sample": cut})  # what crossed by then is the sample
    assert _plan_done({"plan_plain": plain, "plan_sample": cut, "plan_hidden": {"done": True}})
    assert not _plan_done({"plan_plain": plain, "plan_hidden": {"done": False}})
    assert not _plan_done({"plan_plain": {**plain, "timeout": True}})


def test_the_projects_own_code_that_a_dependency_installed_is_removed_from_the_environment(tmp_path: Path):
    """freezegun requires python-dateutil: python-dateutil's own test dependencies put PyPI's
    dateutil in the environment, which comes before the repository on the path: the tests would
    have imported, and the judge judged, that copy."""
    from fleet_pipelines.workspace.environment import _drop_own, own_names

    project, env = tmp_path / "project", tmp_path / "env"
    (project / "src" / "dateutil").mkdir(parents=True)
    (project / "src" / "dateutil" / "__init__.py").write_text("")
    (project / "tests").mkdir()
    (project / "tests" / "test_tz.py").write_text("")
    (project / "setup.py").write_text("")
    (project / "updatezinfo.py").write_text("")
    assert own_names(project) == {"dateutil", "updatezinfo"}
    for folder in ("dateutil", "freezegun", "python_dateutil-2.9.0.dist-info", "freezegun-1.5.1.dist-info"):
        (env / folder).mkdir(parents=True)
    (env / "six.py").write_text("")
    (env / "python_dateutil-2.9.0.dist-info" / "RECORD").write_text(
        "dateutil/__init__.py,sha256=x,1\npython_dateutil-2.9.0.dist-info/METADATA,,\n"
    )
    (env / "freezegun-1.5.1.dist-info" / "RECORD").write_text("freezegun/api.py,sha256=x,1\n")
    assert _drop_own(project, env) == ["dateutil"]
    assert sorted(p.name for p in env.iterdir()) == ["freezegun", "freezegun-1.5.1.dist-info", "six.py"]


def test_a_test_dependency_unpinned_keeps_its_extras_and_marker():
    """The retry of test dependencies whose pins pip cannot meet together (`_install_tests`)."""
    from fleet_pipelines.workspace.environment import unpinned

    assert unpinned("pytest-asyncio==0.23.6") == "pytest-asyncio"
    assert unpinned("foo[bar]>=1,<2; python_version < '3.12'") == 'foo[bar]; python_version < "3.12"'
    assert unpinned("not a requirement ===") == "not a requirement ==="


def test_a_projects_console_scripts_are_read_where_projects_declare_them(tmp_path: Path):
    from fleet_pipelines.workspace.environment import console_scripts

    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\n[project.scripts]\np = "p.cli:main"\n"bad name" = "p:main"\n'
        'evil = "os; import x:main"\n'
    )
    (tmp_path / "setup.cfg").write_text(
        "[options.entry_points]\nconsole_scripts =\n    q = q.__main__:cli.run\n"
    )
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\n\n"
        "setup(entry_points={'console_scripts': ['dotenv=dotenv.__main__:cli [cli]', 'p = other:main']})\n"
    )
    # the first declaration of a name wins; names and targets that are not plain are left out
    assert console_scripts(tmp_path) == {
        "p": "p.cli:main",
        "q": "q.__main__:cli.run",
        "dotenv": "dotenv.__main__:cli",
    }

"""The repository verdict's pure parts: what a patch is flagged for, what counts (the plan on the
base commit), how a session's outcomes are counted, the checks and the decision they give, and
the boundary between the tests and the code under test (its code process, run here for real)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from fleet_pipelines.domain.decision import Decision, repository_verdict
from fleet_pipelines.domain.models import Task
from fleet_pipelines.domain.scoring import CheckResult, ProposalScore, gate_failures
from fleet_pipelines.domain.workspace import PatchEvidence, TestEvidence, Workspace, patch_flags
from fleet_pipelines.workspace import boundary
from fleet_pipelines.workspace.checks import evidence_checks
from fleet_pipelines.workspace.runs import counted_evidence, hidden_test_ids, pytest_args

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
    plan["t::obj"] = "cannot_cross"
    outcomes = {"t::ok": "passed", "t::skip": "skipped", "t::err": "failed", "t::obj": "passed"}
    outcomes |= {f"t::added_{i}": "passed" for i in range(300)}  # the patch's own: not counted
    evidence = counted_evidence(plan, session(outcomes), "ran", 10)
    assert (evidence.passed, evidence.failed, evidence.status) == (1, 4, "failed")
    assert evidence.failing == ["t::skip", "t::err", "t::gone"] and evidence.cannot_cross == ["t::obj"]
    assert evidence.not_counted == 300 and evidence.first_failure == "t::skip: skipped\nwhy t::skip"
    gone = counted_evidence({"t::a": "boundary"}, session({}, collect_errors=[["t", "ImportError"]]), "r", 1)
    assert gone.first_failure == "t::a: not reported\ncollecting t failed:\nImportError"
    assert counted_evidence({"t::a": "boundary"}, session({"t::a": "passed"}), "r", 1).status == "passed"
    assert counted_evidence({"t::a": "boundary"}, {"timeout": True}, "r", 3).status == "timeout"
    assert counted_evidence({"t::a": "boundary"}, {"results": {}}, "r", 3).status == "error"
    assert counted_evidence({}, session({"x": "passed"}), "r", 3).status == "failed"


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
    assert fine.reasons == ["a1 ranked first with score 0.500"] and fine.winner_patch == "p"
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
                raise ParseError(f"bad {text}")

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


def test_only_plain_data_crosses_the_boundary(code):
    wire, side = code
    side.request(["import", "calc"])
    add = side.request(["get", "calc:add"])
    assert add(2, 3) == 5 and type(add(2, 3)) is int and add.__name__ == "calc:add"
    assert side.request(["get", "calc:CONSTANT"]) == [1, 2]
    with pytest.raises(wire.NotPlainData, match="returned a Always is not plain data"):
        side.request(["get", "calc:liar"])(1, 2)
    opaque = side.request(["get", "calc:OBJECT"])
    with pytest.raises(wire.NotPlainData, match="calc:OBJECT is a object of the code under test"):
        _ = opaque == 1
    with pytest.raises(KeyError, match="no"):
        side.request(["get", "calc:fails"])()
    with pytest.raises(wire.NotPlainData, match="only plain data can be passed"):
        add(object(), 1)
    with pytest.raises(AttributeError):
        side.request(["get", "calc:missing"])
    assert side.request(["get", "calc:where"])() == side.cwd
    parse_error = side.request(["get", "calc:ParseError"])  # the repository's exception class crosses
    assert issubclass(parse_error, ValueError) and parse_error is side.request(["get", "calc:ParseError"])
    with pytest.raises(parse_error, match="bad x"):
        side.request(["get", "calc:parse"])("x")


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

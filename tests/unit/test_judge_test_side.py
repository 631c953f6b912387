"""What the tests resolve from the base commit (their folders' helpers, the modules only tests
import, what a star import may bind) and what a code exception becomes on the test side; the
boundary's code process run here for real (no sandbox: the rules, not the isolation)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from fleet_pipelines.domain.workspace import patch_flags
from fleet_pipelines.workspace import boundary

WIRE = Path(boundary.__file__).parents[1] / "sandbox" / "init.py"
STDLIB = frozenset(sys.stdlib_module_names)


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


LAYOUT = {
    "pkg/__init__.py": "from .core import *\nfrom . import cli_helpers\n",
    "pkg/core.py": "from .util import twice\n\ndef add(a, b):\n    return a + b\n",
    "pkg/util.py": "def twice(x):\n    return 2 * x\n",
    "pkg/cases.py": '"""Cases."""\nADD = [(1, 2, 3)]\n',  # data only, only tests import it
    "pkg/testing_asserts.py": "from pkg.core import add\n\ndef check(a, b, c):\n    assert add(a, b) == c\n",
    "pkg/cli.py": "import sys\n\ndef main():\n    return sys.argv\n",  # only tests import it: code
    "pkg/cli_helpers.py": "X = 1\n",  # data, but the package imports it: code
    "pkg/compat.py": "import warnings\n\nwarnings.warn('old')\nX = 1\n",  # it calls: code (as toolz's)
    "tests/helpers.py": "def same(a, b):\n    assert a == b\n",
    "tests/test_core.py": (
        "from helpers import same\nfrom pkg import *\nfrom pkg.cases import ADD\n"
        "from pkg.testing_asserts import check\nfrom pkg.cli import main\nfrom pkg import cli_helpers\n"
        "import pkg.compat\n"
    ),
}


@pytest.mark.parametrize("layout", ["flat", "src"])
def test_the_test_side_is_decided_from_the_base_import_graph(tmp_path: Path, layout: str):
    files = {(f"src/{k}" if layout == "src" and k.startswith("pkg/") else k): v for k, v in LAYOUT.items()}
    base = write(tmp_path, files)
    side = boundary.test_side(str(base))
    prefix = "src/" if layout == "src" else ""
    root = str(base / "src") if layout == "src" else str(base)
    assert side.modules == {"pkg.cases": root, "pkg.testing_asserts": root}
    assert side.top_names == {"helpers", "test_core"}
    assert side.files == (
        f"{prefix}pkg/cases.py",
        f"{prefix}pkg/testing_asserts.py",
        "tests/helpers.py",
        "tests/test_core.py",
    )
    # a patch editing them is flagged like a test edit; the code's own modules are not
    flags = patch_flags([f"{prefix}pkg/cases.py", f"{prefix}pkg/cli.py"], "", STDLIB, [], side.files)
    assert flags == [f"{prefix}pkg/cases.py: test file"]


def test_a_test_folder_that_is_a_package_adds_no_top_level_name(tmp_path: Path):
    base = write(
        tmp_path, {"calc.py": "", "tests/__init__.py": "", "tests/helpers.py": "", "tests/test_a.py": ""}
    )
    side = boundary.test_side(str(base))
    assert side.top_names == frozenset() and side.modules == {}


@pytest.fixture
def code(tmp_path: Path):
    """A boundary to a code process on a small repository."""
    write(
        tmp_path,
        {
            "calc.py": """
                import pytest_like as pytest
                COUNT = []

                class Stop(StopIteration):
                    pass

                def stop(x):
                    raise StopIteration(x)

                def stop_own(x):
                    raise Stop(x)

                def interrupt():
                    raise KeyboardInterrupt

                def exits():
                    raise SystemExit(0)

                def abs(x):
                    return 0

                def sorted(x):
                    return x

                def counted():
                    COUNT.append(1)
                    return len(COUNT)

                def add(a, b):
                    return a + b
                """,
            "pytest_like.py": "",
        },
    )
    wire = boundary.load_wire(str(WIRE))
    source = Path(boundary.__file__).read_text()
    side = boundary.Boundary(
        wire, str(WIRE), source, [str(tmp_path)], str(tmp_path), {"PATH": os.environ["PATH"]}
    )
    finder = boundary.RepositoryFinder(side, ["calc", "pytest_like"])
    sys.meta_path.insert(0, finder)
    yield wire, side
    sys.meta_path.remove(finder)
    for name in ("calc", "pytest_like"):
        sys.modules.pop(name, None)
    side.restart()


def test_control_flow_raised_by_the_code_never_acts_as_the_tests_own(code):
    import calc  # type: ignore[import-not-found]

    with pytest.raises(RuntimeError, match="StopIteration raised in the code under test") as raised:
        calc.stop(1)
    assert not isinstance(raised.value, StopIteration)
    with pytest.raises(RuntimeError):  # a generator's end would make all() hold: PEP 479's choice
        all(map(calc.stop, [1, 2]))
    with pytest.raises(RuntimeError) as own:  # the repository's subclass: a RuntimeError surrogate
        calc.stop_own(1)
    assert not isinstance(own.value, StopIteration) and type(own.value).__name__ == "Stop"
    for call, name in ((calc.interrupt, "KeyboardInterrupt"), (calc.exits, "SystemExit")):
        with pytest.raises(RuntimeError, match=f"{name} raised in the code under test"):
            call()  # never the test process's own interrupt or exit
    assert calc.add(1, 2) == 3  # the code process serves on


def test_a_star_import_never_binds_a_builtin_or_a_name_the_test_module_binds(code):
    namespace: dict = {"__name__": "test_star"}
    source = "import os as pytest\nfrom calc import *\nresult = (abs(-2), sorted([2, 1]), add(1, 2))\n"
    exec(compile(source, "<star>", "exec"), namespace)
    assert namespace["result"] == (2, [1, 2], 3)
    assert namespace["pytest"] is os and "COUNT" in namespace  # the test's own binding stays


def test_a_restart_leaves_nothing_of_the_code_in_memory(code):
    import calc  # type: ignore[import-not-found]

    assert (calc.counted(), calc.counted()) == (1, 2)
    first = side_pid = code[1].pid
    code[1].restart()
    assert calc.counted() == 1 and code[1].pid != first
    with pytest.raises(ChildProcessError):
        os.waitpid(side_pid, os.WNOHANG)  # the old process is reaped


def test_a_patch_that_edits_doctest_examples_is_flagged_like_a_test_edit():
    import difflib

    from fleet_pipelines.domain.workspace import doctest_edits

    module = (
        'def join(words):\n    """Join.\n\n    >>> join(["a", "b"])\n    \'a-b\'\n    """\n'
        '    return "-".join(words)\n'
    )

    def patch(new: str, path: str = "slug/util.py") -> str:
        lines = difflib.unified_diff(module.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}")
        return "".join(lines)

    assert doctest_edits(patch(module.replace("'a-b'", "'a_b'"))) == ["slug/util.py"]  # the output
    assert doctest_edits(patch(module.replace('join(["a", "b"])', 'join(["a"])'))) == ["slug/util.py"]
    assert doctest_edits(patch(module.replace('"-".join', '"_".join'))) == []  # the code only
    assert doctest_edits(patch(module.replace("'a-b'", "'a_b'"), "README.txt")) == []
    flags = patch_flags(["slug/util.py"], "", STDLIB, [], (), ["slug/util.py"])
    assert flags == ["slug/util.py: test file"]

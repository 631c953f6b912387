"""The boundary between a repository's tests and the code they judge (standard library only; it
runs inside the sandbox, loaded by `sandbox_job.py`).

A counted test session has two processes, as function tests have (`fleet_pipelines.sandbox.init`):
- the **test process** (a fork of the trusted job program, which never imported the repository)
  runs pytest on tests the patch cannot change: the base commit's test files (the read-only
  workspace) or the task's hidden tests (held in this process's memory only: the file pytest
  collects holds one import line). It never imports the repository: a meta path finder, first on
  `sys.meta_path`, answers every import of a repository module with a proxy module;
- the **code process** (`python -I -S -B -c <this file> serve ...`, started on the first such
  import, so it never holds the tests in its memory) imports the patched repository, with the
  standard library and the environment ahead of it on `sys.path`, and answers requests for its
  names: a function becomes a stub whose calls are requests, a value comes back as a copy.

Only plain data crosses, on the wire of `init.py` (exact builtin types, rebuilt on arrival), and
the outcomes go, one JSON line each, to a pipe only the test process holds. A test that needs an
object of the code under test (an instance, a generator) fails with `NotPlainData`: it "cannot
cross", which the plan on the base commit records (`sandbox_job.py`).
"""

import ast
import builtins
import contextlib
import dis
import importlib
import importlib.machinery
import importlib.util
import json
import linecache
import os
import re
import signal
import socket
import subprocess
import sys
import types

HIDDEN_MODULE = "fleet_hidden_tests"
TEST_NAMES = ("conftest", "test", "tests", "testing")
HIDDEN_FILE = "test_fleet_hidden.py"
PLAIN_DUNDERS = ("__all__", "__version__")


def load_wire(path):
    """init.py's wire (send, recv, encode, decode, NotPlainData, ...) as a module."""
    spec = importlib.util.spec_from_file_location("fleet_wire", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the code process ---


def builtin_base(cls):
    """The nearest builtin class of an exception class (its name crosses; the test process raises
    its own)."""
    import builtins

    for base in cls.__mro__:
        if getattr(builtins, base.__name__, None) is base:
            return base.__name__
    return cls.__name__


def qualified(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def answer(wire, request):
    kind, name = request[0], request[1]
    if kind == "import":
        importlib.import_module(name)
        return ["ok", None]
    module_name, _, attr = name.partition(":")
    module = importlib.import_module(module_name)
    if kind == "get":
        if attr == "__all__" and not hasattr(module, "__all__"):
            return ["ok", wire.encode([n for n in vars(module) if not n.startswith("_")])]
        value = getattr(module, attr)
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, type) and issubclass(value, Exception):
            return ["exception", qualified(value), builtin_base(value)]
        if callable(value):
            return ["callable"]
        try:
            return ["ok", wire.encode(value)]
        except wire.NotPlainData:
            return ["opaque", f"a {type(value).__name__}"]
    if kind == "call":
        args = [wire.decode(a) for a in request[2]]
        kwargs = {k: wire.decode(v) for k, v in request[3]}
        return ["ok", wire.encode(getattr(module, attr)(*args, **kwargs))]
    raise ValueError(f"unknown request {kind!r}")


def serve(wire_path, fd, paths, cwd):
    """The code process: the repository after the standard library and the environment."""
    import builtins
    import traceback

    wire = load_wire(wire_path)
    sys.path.extend(paths)
    os.chdir(cwd)
    builtins.exit = builtins.quit = sys.exit
    sock = socket.socket(fileno=fd)
    while True:
        try:
            request = wire.recv(sock)
        except EOFError:
            return
        try:
            reply = answer(wire, request)
        except wire.NotPlainData as exc:
            reply = ["not plain", str(exc)]
        except BaseException as exc:
            text, where = str(exc)[:2000], traceback.format_exc(limit=4)[-2000:]
            base = builtin_base(type(exc))
            if base == type(exc).__name__ or not isinstance(exc, Exception):
                reply = ["err", base, text, where]
            else:  # the repository's own exception class: the tests catch it by that name
                reply = ["raised", base, qualified(type(exc)), text, where]
        wire.send(sock, reply)


# --- the test process ---


class Opaque:
    """A name of the code under test whose value is no plain data: any use of it fails the test
    with NotPlainData (it cannot cross)."""

    def __init__(self, wire, name, what):
        object.__setattr__(self, "_refusal", (wire.NotPlainData, f"{name} is {what}"))

    def _refuse(self, *args, **kwargs):
        kind, text = object.__getattribute__(self, "_refusal")
        raise kind(f"{text} of the code under test: only plain data crosses to the tests")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._refuse()

    def __repr__(self):
        return f"<opaque: {object.__getattribute__(self, '_refusal')[1]}>"

    __call__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _refuse
    __iter__ = __len__ = __getitem__ = __contains__ = __setattr__ = __hash__ = _refuse
    __add__ = __radd__ = __sub__ = __mul__ = __int__ = __float__ = __index__ = _refuse


class Boundary:
    """The test process's side: the code process (started on first use) and its socket."""

    def __init__(self, wire, wire_path, source, paths, cwd, env):
        self.wire = wire
        self.source = source
        self.wire_path = wire_path
        self.paths = paths  # after the standard library: the environment, then the repository
        self.cwd = cwd
        self.env = env
        self.sock = None
        self.pid = None
        self.dead = ""
        self.exceptions = {}
        self.names = frozenset()  # the repository's top-level module names (RepositoryFinder's)

    def exception_class(self, name, base):
        """The test process's own class for the repository's exception class `name` (one per
        name), derived from its nearest builtin exception class (RuntimeError for StopIteration
        and the other control-flow classes, `init.CONTROL_FLOW`). The code's names are only
        labels: nothing but a builtin exception class is ever looked up by them."""
        import builtins

        known = self.exceptions.get(name)
        if known is None:
            parent = getattr(builtins, base, None) if base.isidentifier() else None
            if base in self.wire.CONTROL_FLOW:  # never the test process's own control flow
                parent = RuntimeError
            elif not (isinstance(parent, type) and issubclass(parent, Exception)):
                parent = Exception
            module, _, short = name.rpartition(".")
            known = type(short, (parent,), {"__module__": module, "__qualname__": short})
            self.exceptions[name] = known
        return known

    def start(self):
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-I", "-S", "-B", "-c", self.source, "serve", self.wire_path]
        argv += [str(theirs.fileno()), json.dumps(self.paths), self.cwd]
        process = subprocess.Popen(
            argv,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
            cwd="/",
            start_new_session=True,  # its process group ends with it (`restart`)
        )
        theirs.close()
        self.sock, self.pid = ours, process.pid

    def restart(self):
        """Ends the code process (its next request starts a fresh one): nothing the code kept in
        memory reaches the next test."""
        if self.sock is not None:
            self.sock.close()
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(self.pid, 0)
        self.sock = self.pid = None
        self.dead = ""

    def request(self, message):
        wire = self.wire
        if self.dead:
            raise wire.SolutionError(self.dead)
        if self.sock is None:
            self.start()
        try:
            wire.send(self.sock, message)
            reply = wire.recv(self.sock)
        except (OSError, EOFError, ValueError) as exc:
            self.dead = f"the code under test is gone: {wire.exit_description(self.pid)} ({exc})"
            raise wire.SolutionError(self.dead) from None
        if type(reply) is list and len(reply) == 2 and reply[0] == "ok":
            return wire.decode(reply[1])
        if reply == ["callable"] and message[0] == "get":
            return wire.entry_point(self, message[1])
        if type(reply) is list and len(reply) == 2 and type(reply[1]) is str:
            if reply[0] == "module" and message[0] == "get":
                if reply[1].partition(".")[0] in self.names:
                    return importlib.import_module(reply[1])  # through the finder: a proxy
                return Opaque(wire, message[1], f"the module {reply[1][:100]}")
            if reply[0] == "opaque":
                return Opaque(wire, message[1], reply[1][:200])
            if reply[0] == "not plain":
                raise wire.NotPlainData(f"the code under test returned {reply[1][:200]}")
        strings = type(reply) is list and all(type(x) is str for x in reply)
        if strings and len(reply) == 3 and reply[0] == "exception" and message[0] == "get":
            return self.exception_class(reply[1][:300], reply[2])
        if strings and len(reply) == 5 and reply[0] == "raised":
            exc = self.exception_class(reply[2][:300], reply[1])(reply[3])
            exc.add_note("in the code under test:\n" + reply[4])
            raise exc
        if strings and len(reply) == 4 and reply[0] == "err":
            raise wire.remote_exception(*reply[1:])
        raise wire.NotPlainData("malformed reply from the code under test")

    def call(self, name, args, kwargs):
        wire = self.wire
        try:
            wire_args = [wire.encode(a) for a in args]
            wire_kwargs = [[k, wire.encode(v)] for k, v in kwargs.items()]
        except wire.NotPlainData as exc:
            raise wire.NotPlainData(f"only plain data can be passed to the code under test: {exc}") from None
        return self.request(["call", name, wire_args, wire_kwargs])


class RemoteModule(types.ModuleType):
    """A module of the repository as the tests see it: its names fetched on use."""

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__") and attr not in PLAIN_DUNDERS:
            raise AttributeError(attr)
        boundary = self.__dict__["__spec__"].loader.boundary
        value = boundary.request(["get", f"{self.__name__}:{attr}"])
        if attr == "__all__" and star_import(sys._getframe(1)):
            return star_names(boundary.wire, value, sys._getframe(1))
        if callable(value) or isinstance(value, types.ModuleType):
            self.__dict__[attr] = value  # a function's stub, a class or a module: the same on every use
        return value

    def __setattr__(self, attr, value):
        if (attr.startswith("__") and attr.endswith("__")) or isinstance(value, types.ModuleType):
            return super().__setattr__(attr, value)  # the import system's (a submodule's binding)
        wire = self.__dict__["__spec__"].loader.boundary.wire
        raise wire.NotPlainData(
            f"setting {self.__name__}.{attr} would change the tests' view only, not the code under test"
        )


STAR_OPS = frozenset({"IMPORT_STAR", "CALL_INTRINSIC_1"})  # `from m import *` (3.11; 3.12 on)


def star_import(frame):
    """Whether `frame` is running `from module import *` now."""
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and dis.opname[code[frame.f_lasti]] in STAR_OPS


def star_names(wire, names, frame):
    """The names `from <code> import *` binds in a test module: never a builtin (`abs`, `sorted`)
    and never a name the test module binds itself (`pytest`, its helpers), wherever in it. A
    deliberate trade-off: a test that takes such a name from a star import gets the builtin or
    its own binding where plain pytest would give the package's; it must import it by name."""
    if type(names) not in (list, tuple) or not all(type(n) is str for n in names):
        raise wire.NotPlainData("the code under test's __all__ is not a list of names")
    bound = set(frame.f_globals)
    with contextlib.suppress(SyntaxError, ValueError):  # the base's file, or the hidden tests'
        bound |= bound_names(ast.parse("".join(linecache.getlines(frame.f_code.co_filename))))
    return [n for n in names if not hasattr(builtins, n) and n not in bound]


def bound_names(tree):
    """Every name a module's source binds anywhere (assignments, imports, definitions)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names if a.name != "*")
    return names


def test_part(name):
    """Whether a module name (one dotted part) is a test's (pytest imports those from the base)."""
    return name in TEST_NAMES or name.startswith("test_") or name.endswith("_test")


class RepositoryFinder:
    """First on sys.meta_path: the repository's modules are proxies of the code process. Test
    modules inside its packages (`pkg.tests.test_x`, `pkg.conftest`) and the modules only tests
    import (`TestSide.modules`) are the base commit's files, imported here."""

    def __init__(self, boundary, names, base_roots=(), side=None):
        self.boundary = boundary
        self.names = boundary.names = frozenset(names)
        self.base_roots = list(base_roots)
        self.side = side or TestSide()

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        root = self.side.modules.get(fullname)
        if root is not None:
            return importlib.machinery.PathFinder.find_spec(fullname, [os.path.join(root, *parts[:-1])])
        if parts[0] not in self.names:
            return None
        if any(test_part(p) for p in parts[1:]):
            for root in self.base_roots:
                where = os.path.join(root, *parts[:-1])
                spec = importlib.machinery.PathFinder.find_spec(fullname, [where])
                if spec is not None:
                    return spec
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        self.boundary.request(["import", spec.name])
        module = RemoteModule(spec.name)
        parts = spec.name.split(".")
        for root in self.base_roots:  # the base's file: where pytest finds its doctests
            for where in (os.path.join(root, *parts, "__init__.py"), os.path.join(root, *parts) + ".py"):
                if os.path.isfile(where):
                    module.__file__ = where
                    return module
        return module

    def exec_module(self, module):
        pass


class HiddenFinder:
    """The task's hidden tests as a module built from memory (never a file of the sandbox)."""

    def __init__(self, source, rewrite):
        self.source = source
        self.rewrite = rewrite

    def find_spec(self, fullname, path=None, target=None):
        if fullname != HIDDEN_MODULE:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        lines = self.source.splitlines(True)
        linecache.cache[HIDDEN_FILE] = (len(self.source), None, lines, HIDDEN_FILE)  # never a file
        tree = ast.parse(self.source, filename=HIDDEN_FILE)
        try:
            self.rewrite(tree, self.source.encode(), HIDDEN_FILE, None)  # pytest's assertion messages
        except Exception:
            tree = ast.parse(self.source, filename=HIDDEN_FILE)
        exec(compile(tree, HIDDEN_FILE, "exec"), module.__dict__)


SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "venv", "build", "dist", "site-packages"})
MAX_SOURCES = 5_000
MAX_SOURCE_BYTES = 1_000_000


def test_file(parts):
    """Whether a file (its path's parts) is one pytest collects or configures with: test_*.py,
    *_test.py, conftest.py, or any file in a test-named folder."""
    stem = parts[-1].removesuffix(".py")
    return stem == "conftest" or any(test_part(p) for p in (*parts[:-1], stem))


def test_word(name):
    """A module name made for tests (`testutils`, `_testing_helpers`, `fixtures`)."""
    name = name.lstrip("_").lower()
    return name.startswith("test") or name.endswith(("_test", "_tests")) or "fixture" in name


def _sources(base):
    """(path parts relative to `base`, source) of the Python files of the base commit."""
    found = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        rel = os.path.relpath(folder, base)
        parts = () if rel == "." else tuple(rel.split(os.sep))
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or not os.path.isfile(path) or os.path.islink(path):
                continue
            if len(found) >= MAX_SOURCES or os.path.getsize(path) > MAX_SOURCE_BYTES:
                continue
            with open(path, "rb") as f:
                found.append(((*parts, name), f.read()))
    return found


IMPORT_LINES = re.compile(
    rb"^[ \t]*(from[ \t]+[.\w]+[ \t]+import[ \t]*(?:\([^)]*\)|[^\n]*)|import[ \t]+[^\n]*)", re.MULTILINE
)


def _imports(text, module, package):
    """The dotted names a module's source imports (each `from a import b` as a and a.b): its
    import statements found by their lines, each parsed alone (a whole file is not parsed)."""
    names = set()
    for found in IMPORT_LINES.finditer(text):
        try:
            nodes = ast.parse(found.group(1).decode("utf-8", "replace").rstrip("\\ \t\r")).body
        except (SyntaxError, ValueError):
            continue
        for node in nodes:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = (package if package else module).split(".")
                    anchor = anchor[: len(anchor) - node.level + 1] if node.level > 1 else anchor
                    prefix = ".".join(p for p in (*anchor, node.module or "") if p)
                else:
                    prefix = node.module or ""
                if prefix:
                    names.add(prefix)
                    names.update(f"{prefix}.{a.name}" for a in node.names if a.name != "*")
    return {n for name in names for n in _prefixes(name)}


def _prefixes(name):
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _data_only(tree):
    """A module of data: its body holds imports, assignments and its docstring, and nothing in it
    calls anything (no function, class, call or statement with a body: toolz.compatibility,
    which warns on import, is code)."""
    kinds = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)
    for node in tree.body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (isinstance(node, kinds) or docstring):
            return False
    return not any(isinstance(node, ast.Call) for node in ast.walk(tree))


class TestSide:
    """What the tests resolve from the base commit, decided from the base's import graph alone
    (the patch cannot change it): `top_names`, the modules of the tests' own folders (pytest
    puts a test folder without __init__.py on sys.path: `from helpers import check`); `modules`,
    the repository's modules that only tests import (dotted name -> the source root they are
    imported from); `files`, the paths (relative to the project) of both, which a patch edits
    as it edits a test."""

    def __init__(self, top_names=(), modules=None, files=()):
        self.top_names = frozenset(top_names)
        self.modules = dict(modules or {})
        self.files = tuple(files)


RUNS_CODE = re.compile(rb"^[ \t]*(?:async[ \t]+def|def|class|if|for|while|with|try)\b", re.MULTILINE)


class _Source:
    """A Python file of the base: where it is, its module name, and (parsed on demand, once) the
    names it imports."""

    def __init__(self, parts, text, roots):
        self.parts, self.text = parts, text
        self.is_test = test_file(parts)
        self.root = next((r for r in sorted(roots, key=len, reverse=True) if _under(parts, r)), None)
        inside = parts[len(self.root.split("/")) if self.root else 0 :] if self.root is not None else parts
        dotted = [p.removesuffix(".py") for p in inside]
        self.is_package = dotted[-1] == "__init__"
        dotted = dotted[:-1] if self.is_package else dotted
        self.name = ".".join(dotted)
        self.valid = self.root is not None and bool(dotted) and all(p.isidentifier() for p in dotted)
        self._tree = self._imports = None

    def tree(self):
        if self._tree is None:
            try:
                self._tree = ast.parse(self.text)
            except (SyntaxError, ValueError):
                self._tree = ast.Module(body=[], type_ignores=[])
        return self._tree

    def imports(self):
        if self._imports is None:
            package = self.name if self.is_package else self.name.rpartition(".")[0]
            self._imports = _imports(self.text, self.name, package) - {self.name} if self.valid else set()
        return self._imports


def test_side(base, roots=("", "src")):
    """The base commit's test side at `base` (the project's folder). A module is the tests' own
    when it sits in a test folder that pytest puts on sys.path, or when tests import it, no
    other module does, and it is made for tests (named so) or holds data only; a module the
    code imports, or one with functions and a name of the code's, stays the code's. Only the
    candidates and the files that mention their names are parsed."""
    roots = [r for r in roots if os.path.isdir(os.path.join(base, r))]
    sources = [_Source(parts, text, roots) for parts, text in _sources(base)]
    folders = {s.parts[:-1] for s in sources if s.is_test}
    inits = {s.parts[:-1] for s in sources if s.is_package}
    top_names, files = set(), []
    for source in sources:
        folder = source.parts[:-1]
        if folder in folders and folder not in inits and "/".join(folder) not in roots:
            top_names.add(source.parts[-1].removesuffix(".py"))  # found through pytest's sys.path entry
            files.append("/".join(source.parts))
    modules = {s.name: s for s in sources if s.valid and not s.is_test and not s.is_package}
    chosen = {}
    for name, module in modules.items():
        word = test_word(name.rpartition(".")[2])
        if not word and RUNS_CODE.search(module.text):
            continue
        last = name.rpartition(".")[2].encode()
        mention = re.compile(
            rb"\b(?:import|from)\b[^\n]*\b%s\b|\bimport\s*\([^)]*\b%s\b" % ((re.escape(last),) * 2)
        )

        def imports_it(source, name=name, last=last, mention=mention, module=module):
            return (
                source is not module
                and last in source.text
                and mention.search(source.text)
                and name in source.imports()
            )

        if any(imports_it(s) for s in sources if not s.is_test) or not any(
            imports_it(s) for s in sources if s.is_test
        ):
            continue  # the code imports it, or no test does
        if word or (_data_only(module.tree()) and not module.imports() & set(modules)):
            chosen[name] = os.path.join(base, module.root) if module.root else base
            files.append("/".join(module.parts))
    return TestSide(top_names, chosen, sorted(set(files)))


def _under(parts, root):
    return not root or tuple(parts[: len(root.split("/"))]) == tuple(root.split("/"))


def repository_names(roots, env_paths, stdlib):
    """Top-level module names the repository defines at its source roots, less the standard
    library's, the environment's and those of tests (which pytest imports from the base)."""
    names = set()
    for root in roots:
        try:
            entries = os.listdir(root)
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(root, entry)
            if entry.endswith(".py") and os.path.isfile(path):
                names.add(entry[:-3])
            elif os.path.isdir(path) and entry.isidentifier():
                try:
                    if any(f.endswith(".py") for f in os.listdir(path)):
                        names.add(entry)
                except OSError:
                    continue
    finder = importlib.machinery.PathFinder
    return sorted(
        n
        for n in names
        if n.isidentifier()
        and n not in stdlib
        and not test_part(n)
        and n not in ("sitecustomize", "usercustomize")
        and finder.find_spec(n, env_paths) is None
    )


class DoctestGlobals(dict):
    """A doctest's globals: the names its module binds in the base's source, fetched from the
    code under test on use (builtins otherwise, as the module would see them)."""

    def __init__(self, module, names):
        super().__init__(__name__=module.__name__)
        self.module = module
        self.names = names

    def __missing__(self, name):
        if name not in self.names:
            raise KeyError(name)
        try:
            return getattr(self.module, name)
        except AttributeError:
            raise KeyError(name) from None


def docstrings(tree, prefix):
    """(name, docstring, line) of a module's source and each class and function in it, named as
    doctest's finder names them (`pkg.mod`, `pkg.mod.Class.method`)."""
    found = []
    text = ast.get_docstring(tree, clean=False)
    if text:
        found.append((prefix, text, 0))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    stack = [(prefix, node) for node in tree.body if isinstance(node, kinds)]
    while stack:
        outer, node = stack.pop()
        name = f"{outer}.{node.name}"
        text = ast.get_docstring(node, clean=False)
        if text:
            found.append((name, text, node.body[0].lineno - 1))
        if isinstance(node, ast.ClassDef):
            stack.extend((name, child) for child in node.body if isinstance(child, kinds))
    return sorted(found)


def remote_doctests(collector, module):
    """The doctests of a repository module, as pytest's doctest plugin would collect them: the text
    from the base commit's file, the names from the code under test."""
    import doctest

    from _pytest import doctest as plugin

    with open(collector.path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = bound_names(tree)
    config = collector.config
    try:
        flags = plugin.get_optionflags(config)
    except AttributeError:  # pytest before 8.1 takes the collector
        flags = plugin.get_optionflags(collector)
    runner = plugin._get_runner(
        checker=plugin._get_checker(),
        verbose=False,
        optionflags=flags,
        continue_on_failure=plugin._get_continue_on_failure(config),
    )
    parser = doctest.DocTestParser()
    for name, text, line in docstrings(tree, module.__name__):
        test = parser.get_doctest(text, {}, name, str(collector.path), line)
        test.globs = DoctestGlobals(module, names)  # DocTest keeps a plain copy of what it is given
        if test.examples:
            yield plugin.DoctestItem.from_parent(collector, name=name, runner=runner, dtest=test)


def doctests_from_the_base():
    """pytest's doctest collector, for a module behind the boundary: `remote_doctests`."""
    from _pytest import doctest as plugin

    collect = plugin.DoctestModule.collect

    def collect_remote(self):
        if isinstance(self.obj, RemoteModule):
            return remote_doctests(self, self.obj)
        return collect(self)

    plugin.DoctestModule.collect = collect_remote


def crossed_not(wire, exc):
    """Whether a test failed because a value could not cross (NotPlainData in its chain)."""
    for _ in range(10):
        if exc is None:
            return False
        if isinstance(exc, wire.NotPlainData):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def preload():
    """pytest and its built-in plugins, imported once by the job program: its test processes
    (forks) then start without importing them again."""
    import _pytest.assertion.rewrite  # noqa: F401
    import pytest  # noqa: F401
    from _pytest.config import default_plugins

    for name in default_plugins:
        importlib.import_module(f"_pytest.{name}")


def run_session(session, result_fd):
    """The test process: pytest on `session["args"]` (or on the hidden tests) with the repository
    behind the boundary; every outcome written to `result_fd`. Never returns."""
    try:
        code = _session(result_fd, **session)
    except BaseException as exc:  # the harness itself failed: reported, never a pass
        _emit(result_fd, {"harness_error": f"{type(exc).__name__}: {exc}"[:1500]})
        code = 70
    _emit(result_fd, {"done": True, "exit": code})
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def _emit(fd, entry):
    os.write(fd, (json.dumps(entry) + "\n").encode())


def _session(
    result_fd,
    wire_path,
    source,
    args,
    cwd,
    code_cwd,
    roots,
    base_roots,
    env_paths,
    env,
    plugin_source,
    hidden_source=None,
):
    os.environ.clear()
    os.environ.update(env)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    work = env.get("HOME", "/work")
    sys.path[:] = [p for p in sys.path if p and p != work and not p.startswith(work + "/")]
    sys.path.extend(env_paths)
    importlib.invalidate_caches()
    os.chdir(cwd)
    wire = load_wire(wire_path)
    boundary = Boundary(wire, wire_path, source, [*env_paths, *roots], code_cwd, env)
    side = test_side(cwd)
    names = set(repository_names([*roots, *base_roots], env_paths, sys.stdlib_module_names))
    names -= side.top_names  # a module the patch adds never shadows one of the tests' own
    names -= {n for n in side.modules if "." not in n}
    sys.meta_path.insert(0, RepositoryFinder(boundary, names, base_roots, side))
    import pytest
    from _pytest.assertion.rewrite import rewrite_asserts

    doctests_from_the_base()

    if hidden_source is not None:
        sys.meta_path.insert(0, HiddenFinder(hidden_source, rewrite_asserts))
        folder = os.path.join(env.get("TMPDIR", work), "fleet-hidden")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, HIDDEN_FILE), "w") as f:
            f.write(f"from {HIDDEN_MODULE} import *  # noqa: F403 (the tests are in memory only)\n")
        with open(os.path.join(folder, "pytest.ini"), "w") as f:
            f.write("[pytest]\n")
        chosen = [os.path.join(folder, i) for i in args if i.startswith(HIDDEN_FILE + "::")]
        args = ["--noconftest", "-c", f"{folder}/pytest.ini", "--rootdir", folder]
        args += ["--import-mode=importlib", *(chosen or [os.path.join(folder, HIDDEN_FILE)])]

    class Recorder:
        def __init__(self):
            self.outcomes = {}
            self.crossed = set()

        def pytest_collection_finish(self, session):
            for item in session.items:
                _emit(result_fd, {"collected": item.nodeid})

        def pytest_collectreport(self, report):
            if report.failed:
                _emit(result_fd, {"collect_error": report.nodeid, "detail": report.longreprtext[-1500:]})

        def pytest_exception_interact(self, node, call, report):
            if call.excinfo is not None and crossed_not(wire, call.excinfo.value):
                self.crossed.add(report.nodeid)

        def pytest_runtest_logreport(self, report):
            entry = self.outcomes.setdefault(report.nodeid, {"outcome": "passed", "detail": ""})
            if report.failed and entry["outcome"] != "failed":
                entry["outcome"], entry["detail"] = "failed", report.longreprtext[-1500:]
            elif report.skipped and entry["outcome"] == "passed":
                entry["outcome"], entry["detail"] = "skipped", str(report.longrepr)[-300:]

        def pytest_runtest_logfinish(self, nodeid, location):
            if hidden_source is not None:  # a fresh code process for each hidden test (the one
                boundary.restart()  # that served the collection serves the first)
            entry = self.outcomes.pop(nodeid, {"outcome": "failed", "detail": "no report"})
            if entry["outcome"] == "failed" and nodeid in self.crossed:
                entry["outcome"] = "cannot_cross"
            _emit(result_fd, {"id": nodeid, **entry})

    addopts = types.ModuleType("fleet_addopts")  # sandbox_job's ADDOPTS_PLUGIN, as plain runs have it
    exec(compile(plugin_source, "fleet_addopts.py", "exec"), addopts.__dict__)
    options = ["-p", "no:cacheprovider", "-p", "no:stepwise", "-o", "console_output_style=classic"]
    return int(pytest.main([*options, *args], plugins=[Recorder(), addopts]))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "serve":
    serve(sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5])

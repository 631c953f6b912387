"""The trusted program inside a sandbox (bound read-only at /fleet/init.py; the sandbox's pid 1).

`python -I -S /fleet/init.py MODE SPEC_FD READY_FD [RESULT_FD]`, standard library only. bwrap runs
it as the sandbox's pid 1 (`--as-pid-1`: no bwrap init the solution could write to). It reads its
spec (files, limits, what to run) from SPEC_FD, writes the files into the work dir, sets the
rlimits on itself (so every process of the sandbox, pid 1 included, runs under them), writes one
byte to READY_FD and closes it, and only then lets the solution's code run. The host reads
READY_FD: a run whose byte never came failed in setup (bwrap or this program), before any code of
the solution ran; nothing of the solution can ever write to it.

- **script** (`run_python`): runs Python on `main.py` in a child (`run_script`); its exit code
  is the result;
- **tests** (`run_tests`): forks the *spawner* (`spawner`) first, before the spec is read (so no
  test code is in its memory), which starts *solution processes* (`serve`) on request, each
  keeping only its end of a socket pair and the sandbox's stdout/stderr: a fresh one for each call
  into the solution, in a work dir and /dev/shm wiped and rewritten from the spec (no state of one
  call reaches the next, in memory or in files: a task's tests and asserts that contradict each
  other stay contradictory); then becomes the *test
  process*: it marks itself non-dumpable (so the solution can neither ptrace it nor open its
  /proc/<pid>/fd or mem), ignores SIGINT (pid 1 of the pid namespace then ignores every signal
  the solution can send), writes the files, tells the solution process to import `solution.py`,
  and runs the task's examples and tests here.

The tests run with pristine builtins (the test process never imports the solution) in a namespace
of their own. A name the tests use that is neither theirs nor a builtin is looked up in the
solution (an *entry point*): a function becomes a local stub whose calls are requests over the
socket, a value comes across as a copy. The task's entry points (the spec's `entry_points`, and
what the tests take `from solution import ...`) are the solution's before any builtin, so a task
may ask for `sorted` or `round`; every other builtin name is the builtin, whatever the solution
defines. Everything crossing is **plain data** (None, bool, int,
float, complex, str, bytes, bytearray, and lists, tuples, dicts, sets and frozensets of these),
rebuilt here from JSON with exact builtin types before any test sees it: no object of the
solution's ever reaches a test's operators, and nothing of the test's (the expected value) is
handed to the solution except the arguments it calls with. A value that is not plain data (an
instance of the solution's class, a generator, a function) raises `NotPlainData` in the test,
which fails that test; a test that passes a callable or any other non-plain argument to the
solution fails the same way. Outcomes go, one JSON line each, to RESULT_FD, which only the test
process holds: whatever the solution prints, or however it exits, it cannot write a result.
"""

import binascii
import builtins
import contextlib
import ctypes
import io
import json
import linecache
import os
import resource
import signal
import socket
import struct
import sys
import time
import traceback

WORK = "/work"
TESTS_FILE = "<tests>"  # the tests' file name in tracebacks: no path the solution can write
MAX_FRAME = 32 * 1024 * 1024
MAX_DEPTH = 64
SETUP_FAILED = 125
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
MB = 1024 * 1024
HASH_SEED = "0"  # the program's `PYTHONHASHSEED` (run_script); a repository job's commands have it too
ADDR_NO_RANDOMIZE = 0x0040000  # personality(2): the program's addresses, and so 3.11's hash(None)


# --- the wire: 4-byte length + JSON; plain values are JSON, tagged lists for everything else ---


def send(sock, message):
    data = json.dumps(message).encode()
    if len(data) > MAX_FRAME:
        raise ValueError(f"message of {len(data)} bytes exceeds {MAX_FRAME}")
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock, size):
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the solution process closed the channel")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv(sock):
    (size,) = struct.unpack(">I", _recv_exact(sock, 4))
    if size > MAX_FRAME:
        raise ValueError(f"message of {size} bytes exceeds {MAX_FRAME}")
    return json.loads(_recv_exact(sock, size))


class NotPlainData(Exception):
    """A value that is not plain data: it cannot cross between the solution and the tests."""


def encode(value, depth=0):
    """Plain data as JSON (tagged lists for containers, bytes and complex); exact builtin types
    only, read through the builtin types' own methods (a subclass cannot answer for itself)."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value
    if kind is float:
        return value
    d = depth + 1
    if kind is complex:
        return ["c", value.real, value.imag]
    if kind is bytes or kind is bytearray:
        return ["b" if kind is bytes else "ba", binascii.b2a_base64(bytes(value)).decode()]
    if kind is tuple or kind is list:
        return ["t" if kind is tuple else "l", [encode(v, d) for v in value]]
    if kind is set or kind is frozenset:
        return ["s" if kind is set else "f", [encode(v, d) for v in value]]
    if kind is dict:
        return ["d", [[encode(k, d), encode(v, d)] for k, v in value.items()]]
    raise NotPlainData(f"a {kind.__name__} is not plain data")


_SCALARS = (type(None), bool, int, float, str)


def decode(data, depth=0):
    """The plain value `data` encodes, rebuilt with exact builtin types; NotPlainData for
    anything that is not a well-formed encoding (what the solution sends is not trusted)."""
    if type(data) in _SCALARS:
        return data
    if depth > MAX_DEPTH or type(data) is not list or not data or type(data[0]) is not str:
        raise NotPlainData("malformed value from the solution process")
    tag, d = data[0], depth + 1
    try:
        if tag == "c" and len(data) == 3 and all(type(x) in (int, float) for x in data[1:]):
            return complex(data[1], data[2])
        if tag in ("b", "ba") and len(data) == 2 and type(data[1]) is str:
            raw = binascii.a2b_base64(data[1])
            return raw if tag == "b" else bytearray(raw)
        if len(data) == 2 and type(data[1]) is list:
            if tag == "d":
                pairs = [p for p in data[1] if type(p) is list and len(p) == 2]
                if len(pairs) != len(data[1]):
                    raise NotPlainData("malformed dict from the solution process")
                return {decode(k, d): decode(v, d) for k, v in pairs}
            if tag in ("t", "l", "s", "f"):
                items = [decode(v, d) for v in data[1]]
                return {"t": tuple, "l": list, "s": set, "f": frozenset}[tag](items)
    except (TypeError, ValueError, binascii.Error) as exc:  # an unhashable key, bad base64
        raise NotPlainData(f"malformed value from the solution process: {exc}") from None
    raise NotPlainData(f"malformed value from the solution process (tag {tag!r})")


# --- the solution process ---


def serve(sock):
    """Imports `solution` from the work dir and answers the test process's requests for its
    names. Forked before the spec is read, so nothing of the tests is in its memory; it waits
    for the files and its limits."""
    set_limits(recv(sock))
    builtins.exit = builtins.quit = sys.exit  # what `site` would give a program
    sys.path.insert(0, WORK)
    try:
        import solution

        names, failure = vars(solution), None
    except BaseException as exc:  # reported on every request
        names, failure = {}, exc
    while True:
        try:
            request = recv(sock)
        except EOFError:
            return
        try:
            if failure is not None:
                raise failure
            kind, name = request[0], request[1]
            if kind == "import":
                reply = ["ok", None]
            elif kind != "names" and name not in names:
                raise NameError(f"name {name!r} is not defined by the solution")
            elif kind == "names":
                reply = ["ok", encode(sorted(n for n in names if not n.startswith("_")))]
            elif kind == "get":
                value = names[name]
                reply = ["callable"] if callable(value) else ["ok", encode(value)]
            elif kind == "call":
                args = [decode(a) for a in request[2]]
                kwargs = {k: decode(v) for k, v in request[3]}
                reply = ["ok", encode(names[name](*args, **kwargs))]
            else:
                raise ValueError(f"unknown request {kind!r}")
        except NotPlainData as exc:
            reply = ["not plain", str(exc)]
        except BaseException as exc:
            reply = ["err", type(exc).__name__, str(exc)[:2000], traceback.format_exc(limit=4)[-2000:]]
        send(sock, reply)


def spawner(control):
    """Forked before the spec is read (nothing of the tests is in its memory): for each byte on
    `control`, a fresh solution process (`serve`, a grandchild: the test process, the sandbox's
    pid 1 and child subreaper, reaps it) on one end of a new socket pair; the other end goes back
    over `control`, its first message the new process's pid."""
    while True:
        try:
            if not control.recv(1):
                return
        except OSError:
            return
        ours, theirs = socket.socketpair()
        middle = os.fork()
        if middle == 0:
            server = os.fork()
            if server == 0:
                control.close()
                ours.close()
                try:
                    serve(theirs)
                finally:
                    os._exit(0)
            send(theirs, server)
            os._exit(0)
        os.waitpid(middle, 0)
        theirs.close()
        socket.send_fds(control, [b"S"], [ours.fileno()])
        ours.close()


# --- the test process ---


class SolutionError(Exception):
    """An exception of the solution that has no builtin counterpart, or the solution's death."""


class Client:
    """The test process's side of the socket: requests for the solution's names, each call after
    the first in a fresh solution process (`fresh`: the one before ended, another started from
    the spawner, `control`, in a wiped work dir)."""

    def __init__(self, control, spawner_pid, spec):
        self.control = control
        self.spawner_pid = spawner_pid
        self.spec = spec
        self.sock = self.process = self.dead = None
        self.called = False
        self.fresh()

    def fresh(self):
        """A new solution process: the one before and every process it left killed, the work
        dir and /dev/shm as the spec wrote them (nothing the solution wrote survives), then the
        new one started with the spec's limits. Each call runs in one: no count, cache or file of
        one call reaches the next (contradictory tests and asserts stay contradictory)."""
        if self.sock is not None:
            self.sock.close()
            end_others(os.getpid(), self.spawner_pid)
            for folder in (WORK, "/dev/shm"):
                wipe_inside(folder)
            write_files(self.spec["files"])
        self.control.send(b"N")
        _, fds, _, _ = socket.recv_fds(self.control, 1, 1)
        self.sock = socket.socket(fileno=fds[0])
        self.process = recv(self.sock)
        send(self.sock, self.spec["limits"])
        self.dead = None

    def request(self, message):
        if self.dead:
            raise SolutionError(self.dead)
        try:
            send(self.sock, message)
            reply = recv(self.sock)
        except (OSError, EOFError, ValueError) as exc:
            self.dead = f"the solution process is gone: {exit_description(self.process)} ({exc})"
            raise SolutionError(self.dead) from None
        if type(reply) is list and reply and reply[0] == "ok" and len(reply) == 2:
            return decode(reply[1])
        if reply == ["callable"] and message[0] == "get":
            return entry_point(self, message[1])
        if type(reply) is list and len(reply) == 2 and reply[0] == "not plain" and type(reply[1]) is str:
            raise NotPlainData(f"the solution returned {reply[1][:200]}")
        if (
            type(reply) is list
            and len(reply) == 4
            and reply[0] == "err"
            and all(type(x) is str for x in reply)
        ):
            raise remote_exception(*reply[1:])
        raise NotPlainData("malformed reply from the solution process")

    def call(self, name, args, kwargs):
        try:
            wire_args = [encode(a) for a in args]
            wire_kwargs = [[k, encode(v)] for k, v in kwargs.items()]
        except NotPlainData as exc:
            raise NotPlainData(f"only plain data can be passed to the solution: {exc}") from None
        if self.called:  # every call in a fresh process: an answer never depends on an earlier call
            self.fresh()
        self.called = True
        return self.request(["call", name, wire_args, wire_kwargs])


# Exceptions that are control flow (iteration's end, a generator's close, an interrupt, an exit):
# raised by a call into the solution they never act as the test process's own (PEP 479's choice
# for generators): `all(map(f, xs))` must not hold because f raised StopIteration.
CONTROL_FLOW = frozenset(
    {"StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit"}
)


def remote_exception(name, text, remote_traceback):
    """The solution's exception as the builtin exception of that name (pristine: the test
    process's own), else a SolutionError (control flow: a RuntimeError, as PEP 479 makes of a
    generator's StopIteration); the solution's traceback as a note."""
    kind = getattr(builtins, name, None) if name.isidentifier() else None
    if name in CONTROL_FLOW:
        exc = RuntimeError(f"{name} raised in the code under test: {text}")
    elif isinstance(kind, type) and issubclass(kind, Exception):
        try:
            exc = kind(text)
        except Exception:
            exc = SolutionError(f"{name}: {text}")
    else:
        exc = SolutionError(f"{name}: {text}")
    exc.add_note("in the solution process:\n" + remote_traceback)
    return exc


def entry_point(client, name):
    """A function of the solution, as the tests see it: a stub of the test process."""

    def call(*args, **kwargs):
        return client.call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class SolutionModule:
    """`solution` as the tests import it: each name taken from it is an entry point (`from
    solution import sorted` binds the solution's `sorted`, before the builtin, in the tests)."""

    def __init__(self, client):
        self._client = client
        self.__name__ = "solution"

    def __getattr__(self, name):
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        if name == "__all__":  # `from solution import *`: its public names but the builtins'
            return [n for n in self._client.request(["names", ""]) if not hasattr(builtins, n)]
        try:
            return self._client.request(["get", name])
        except NameError as exc:
            raise AttributeError(str(exc)) from None


class EntryPoints(dict):
    """The tests' builtins: the pristine builtins, then the solution's names on first use. The
    task's entry points (`entry_points`) are no builtins here: they are always the solution's
    (a task may ask for `sorted`), and a NameError where the solution does not define them."""

    def __init__(self, client, entry_points=()):
        super().__init__(vars(builtins))
        for name in entry_points:
            self.pop(name, None)
        self.client = client
        self.module = SolutionModule(client)
        self["__import__"] = self.import_

    def import_(self, name, globals=None, locals=None, fromlist=(), level=0):
        if name == "solution" and level == 0:
            return self.module
        return builtins.__import__(name, globals, locals, fromlist, level)

    def __missing__(self, name):
        try:
            value = self.client.request(["get", name])
        except NameError:
            raise KeyError(name) from None
        self[name] = value
        return value


_exits = {}


def exit_description(pid):
    """How the solution process ended (waited for up to 1 s; remembered once known)."""
    if pid in _exits:
        return _exits[pid]
    deadline = time.monotonic() + 1
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            return "still running"
        time.sleep(0.005)
    if os.WIFSIGNALED(status):
        _exits[pid] = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        _exits[pid] = f"exit code {os.WEXITSTATUS(status)}"
    return _exits[pid]


def end_others(*keep):
    """Every process of the sandbox but `keep` killed and reaped (read from /proc; where the
    sandbox has none, the solution process's children cannot be found: only it is ended)."""
    for _ in range(100):
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep]
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        while True:  # reap what died (the test process is the sandbox's pid 1 and subreaper)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not pids:
            return


def wipe_inside(folder):
    """Everything in `folder` removed, whatever modes the solution gave it."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            with contextlib.suppress(OSError):
                os.chmod(path, 0o700)
            wipe_inside(path)
            with contextlib.suppress(OSError):
                os.rmdir(path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def run_tests(spec, result_fd, control, spawner_pid):
    """The test process: `control` asks the spawner (`spawner_pid`) for solution processes, a
    fresh one for each call into the solution."""
    client = Client(control, spawner_pid, spec)  # the files are written: it may import now
    sys.stdout = sys.stderr = io.StringIO()  # the tests' prints stay here, out of the solution's reach

    def record(name, passed, detail=""):
        line = json.dumps({"name": name, "passed": passed, "detail": detail[-600:]})
        os.write(result_fd, (line + "\n").encode())

    try:
        client.request(["import", ""])
        imported = True
    except BaseException:
        record("import solution", False, traceback.format_exc(limit=3))
        imported = False
    if imported:
        namespace = {"__name__": "fleet_tests", "__builtins__": EntryPoints(client, spec["entry_points"])}
        for call, expected in spec["examples"]:
            try:
                got, want = eval(call, namespace), eval(expected, namespace)
                record(f"example: {call}", got == want, f"got {got!r}, expected {want!r}")
            except BaseException:
                record(f"example: {call}", False, traceback.format_exc(limit=2))
        if spec["tests"]:
            # The tests' source lines in tracebacks come from here, never from a file the
            # solution could write (a "tests.py" in the work dir would be read by linecache).
            linecache.cache[TESTS_FILE] = (
                len(spec["tests"]),
                None,
                spec["tests"].splitlines(True),
                TESTS_FILE,
            )
            try:
                exec(compile(spec["tests"], TESTS_FILE, "exec"), namespace)
            except BaseException:
                record("tests (top level)", False, traceback.format_exc(limit=3))
            else:
                functions = [(k, v) for k, v in namespace.items() if k.startswith("test_") and callable(v)]
                if not functions:
                    record("tests (top level)", True)
                for name, function in functions:
                    try:
                        function()
                        record(name, True)
                    except BaseException:
                        record(name, False, traceback.format_exc(limit=3))
    client.sock.close()
    control.close()
    solution_exit = exit_description(client.process)
    os.write(result_fd, (json.dumps({"done": True, "solution": solution_exit}) + "\n").encode())
    os._exit(0)


# --- setup, common to both modes ---


def set_limits(limits):
    for kind, value in (
        (resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1)),
        (resource.RLIMIT_AS, (limits["address_space_mb"] * MB,) * 2),
        (resource.RLIMIT_NPROC, (limits["processes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["max_file_mb"] * MB,) * 2),
        (resource.RLIMIT_NOFILE, (256, 256)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),  # POSIX message queues: memory outside the address space
    ):
        resource.setrlimit(kind, value)


def write_files(files):
    for name, text in files.items():
        path = os.path.join(WORK, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def main():
    mode, spec_fd, ready_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode == "tests":
        result_fd = int(sys.argv[4])
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the solution: ours
        control, theirs = socket.socketpair()
        spawner_pid = os.fork()  # before the spec is read: no solution process ever holds it
        if spawner_pid == 0:
            for fd in (spec_fd, ready_fd, result_fd):
                os.close(fd)
            control.close()
            try:
                spawner(theirs)
            finally:
                os._exit(0)
        theirs.close()
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with os.fdopen(spec_fd, "rb") as f:
            spec = json.loads(f.read())
        write_files(spec["files"])
        set_limits(spec["limits"])
        os.write(ready_fd, b"R")  # from here on the solution's code may run
        os.close(ready_fd)
    except BaseException as exc:
        print(f"sandbox setup failed: {exc!r}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    if mode == "tests":
        run_tests(spec, result_fd, control, spawner_pid)
    run_script(spec["env"], spec["limits"])


def run_script(env, limits):
    """pid 1 forks the program and waits for it: the program is no pid 1 (so the kernel's
    SIGXCPU and its own signals act on it as on any process), and pid 1, which it can neither
    write to (non-dumpable) nor signal, reports its end as bwrap would: its exit code, or 128 + N
    when signal N killed it. The program reads no `PYTHON*` variable but its hash seed, fixed
    (`HASH_SEED`), and its addresses are not randomized where the runtime lets us turn that off
    (Docker's and Kubernetes' RuntimeDefault seccomp profiles do not): a set iterates in the same
    order in every run, so pytest's ids of parameters taken from one are the same on the base and
    after every patch (isodate 0.7.2's `expected20`; its set holds a tuple with None, whose hash
    is its address until Python 3.12). Untrusted code already runs in the program's processes:
    fixed addresses give it nothing it lacks. Where the limits give pid 1 and the program address
    spaces of their own (a program of ours, without a cgroup: `setup.bound`), pid 1 takes its own
    once the program is started, and the program starts under its own as a soft limit: the
    processes it starts raise theirs to the hard limit."""
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # then pid 1 ignores every signal the program sends
    program = os.fork()
    if program == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the program's own Python installs its handler
        python = sys.executable
        env = {k: v for k, v in env.items() if not k.startswith("PYTHON")} | {"PYTHONHASHSEED": HASH_SEED}
        libc = ctypes.CDLL(None, use_errno=True)
        libc.personality(libc.personality(0xFFFFFFFF) | ADDR_NO_RANDOMIZE)  # refused: randomized
        if limits.get("program_mb"):
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            resource.setrlimit(resource.RLIMIT_AS, (limits["program_mb"] * MB, hard))
        os.execve(python, [python, "-B", "-s", "main.py"], env)
    if limits.get("pid1_mb"):
        resource.setrlimit(resource.RLIMIT_AS, (limits["pid1_mb"] * MB,) * 2)
    while True:  # orphans are reparented here: reap them too
        pid, status = os.waitpid(-1, 0)
        if pid == program:
            break
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()

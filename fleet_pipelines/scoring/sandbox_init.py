"""The trusted program inside a sandbox (bound read-only at /fleet/init.py, run by bwrap's pid 1).

`python -I -S /fleet/init.py SPEC_FD [RESULT_FD]`, standard library only. It reads its spec (files,
limits, what to run) from SPEC_FD and closes it, writes the files into the work dir, sets the
per-process rlimits, then:

- **script** (`run_python`): execs Python on `main.py`; the exit code is the result;
- **tests** (`run_tests`): forks the *solution process* (`serve`) first, before the spec is read
  (so no test code is in its memory), which keeps only its end of a socket pair and the sandbox's
  stdout/stderr; then becomes the *test process*: it marks itself non-dumpable (so the solution
  can neither ptrace it nor open its /proc/<pid>/fd or mem), writes the files, tells the solution
  process to import `solution.py`, and runs
  the task's examples and tests here against proxies of the solution's names. Every call into
  the solution is a request over the socket; values come back as plain builtins (a copy, so an
  object with a forged `__eq__` cannot pass an assertion against a plain value) or as a handle
  to an object that stays in the solution process. Outcomes go, one JSON line each, to RESULT_FD,
  which only this process holds: whatever the solution prints, or however it exits, it cannot
  write a result.
"""

import binascii
import builtins
import ctypes
import json
import operator
import os
import resource
import signal
import socket
import struct
import sys
import time
import traceback

WORK = "/work"
MAX_FRAME = 32 * 1024 * 1024
MAX_DEPTH = 64
SETUP_FAILED = 125
PR_SET_DUMPABLE = 4


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


def encode(value, as_ref, depth=0):
    """Plain builtins (exact types rebuilt from subclasses) as JSON; anything else via `as_ref`."""
    if value is None or isinstance(value, (bool, str)):
        return str(value) if isinstance(value, str) and type(value) is not str else value
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if depth > MAX_DEPTH:
        return as_ref(value)
    d = depth + 1
    if isinstance(value, complex):
        return ["c", complex.__complex__(value).real, complex.__complex__(value).imag]
    if isinstance(value, (bytes, bytearray)):
        return ["b" if isinstance(value, bytes) else "ba", binascii.b2a_base64(bytes(value)).decode()]
    if isinstance(value, tuple):
        return ["t", [encode(v, as_ref, d) for v in tuple.__iter__(value)]]
    if isinstance(value, list):
        return ["l", [encode(v, as_ref, d) for v in list.__iter__(value)]]
    if isinstance(value, (set, frozenset)):
        tag = "s" if isinstance(value, set) else "f"
        return [tag, [encode(v, as_ref, d) for v in list(value)]]
    if isinstance(value, dict):
        return ["d", [[encode(k, as_ref, d), encode(v, as_ref, d)] for k, v in dict.items(value)]]
    return as_ref(value)


def decode(data, from_ref):
    if not isinstance(data, list):
        return data
    tag = data[0]
    if tag == "r":
        return from_ref(data)
    if tag == "c":
        return complex(data[1], data[2])
    if tag in ("b", "ba"):
        raw = binascii.a2b_base64(data[1])
        return raw if tag == "b" else bytearray(raw)
    if tag == "d":
        return {decode(k, from_ref): decode(v, from_ref) for k, v in data[1]}
    items = [decode(v, from_ref) for v in data[1]]
    return {"t": tuple, "l": list, "s": set, "f": frozenset}[tag](items)


# --- the solution process ---

_BINARY = {
    name: getattr(operator, name)
    for name in (
        "add sub mul truediv floordiv mod pow matmul and_ or_ xor lshift rshift "
        "eq ne lt le gt ge getitem delitem contains"
    ).split()
}
_UNARY = {
    "len": len,
    "iter": iter,
    "next": next,
    "bool": bool,
    "repr": repr,
    "str": str,
    "hash": hash,
    "int": int,
    "float": float,
    "index": operator.index,
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": abs,
    "invert": operator.invert,
}


def serve(sock):
    """Imports `solution` from the work dir and answers the test process's requests. Forked
    before the spec is read, so nothing of the tests is in its memory; it waits for the files
    and its limits."""
    set_limits(recv(sock))
    builtins.exit = builtins.quit = sys.exit  # what `site` would give a program
    handles = {}

    def as_ref(obj):
        handles[id(obj)] = obj
        return ["r", id(obj), type(obj).__name__]

    def from_ref(data):
        return handles[data[1]]

    sys.path.insert(0, WORK)
    try:
        import solution

        module = solution
    except BaseException as exc:  # reported on the first request
        module = exc
    while True:
        try:
            request = recv(sock)
        except EOFError:
            return
        try:
            if isinstance(module, BaseException):
                raise module
            kind = request[0]
            if kind == "names":
                public = {k: v for k, v in vars(module).items() if not k.startswith("__")}
                result = {"solution": module, **public}
            else:
                target = module if request[1] == 0 else handles[request[1]]
                args = [decode(a, from_ref) for a in request[2]]
                if kind == "get":
                    result = getattr(target, *args)
                elif kind == "set":
                    setattr(target, *args)
                    result = None
                elif kind == "call":
                    kwargs = {k: decode(v, from_ref) for k, v in request[3]}
                    result = target(*args, **kwargs)
                elif kind in _UNARY:
                    result = _UNARY[kind](target)
                elif kind in _BINARY:
                    result = _BINARY[kind](target, *args)
                elif kind.startswith("r") and kind[1:] in _BINARY:  # reflected: other <op> target
                    result = _BINARY[kind[1:]](args[0], target)
                elif kind == "setitem":
                    operator.setitem(target, *args)
                    result = None
                else:
                    raise ValueError(f"unknown request {kind!r}")
            reply = ["ok", encode(result, as_ref)]
        except BaseException as exc:
            reply = ["err", type(exc).__name__, str(exc)[:2000], traceback.format_exc(limit=4)[-2000:]]
        send(sock, reply)


# --- the test process ---


class SolutionError(Exception):
    """An exception of the solution that has no builtin counterpart, or the solution's death."""


class Remote:
    """An object that lives in the solution process; every use is a request."""

    __slots__ = ("_rid", "_rtype")

    def __init__(self, rid, rtype):
        object.__setattr__(self, "_rid", rid)
        object.__setattr__(self, "_rtype", rtype)

    def __getattr__(self, name):
        return _client.request("get", self, name)

    def __setattr__(self, name, value):
        _client.request("set", self, name, value)

    def __call__(self, *args, **kwargs):
        return _client.request("call", self, *args, kwargs=kwargs)

    def __setitem__(self, key, value):
        _client.request("setitem", self, key, value)

    def __delitem__(self, key):
        _client.request("delitem", self, key)

    def __repr__(self):
        return _checked(_client.request("repr", self), str)

    def __str__(self):
        return _checked(_client.request("str", self), str)

    def __hash__(self):
        return _checked(_client.request("hash", self), int)

    def __len__(self):
        return _checked(_client.request("len", self), int)

    def __bool__(self):
        return _checked(_client.request("bool", self), bool)

    def __int__(self):
        return _checked(_client.request("int", self), int)

    def __index__(self):
        return _checked(_client.request("index", self), int)

    def __float__(self):
        return _checked(_client.request("float", self), float)

    def __contains__(self, item):
        return bool(_client.request("contains", self, item))


def _checked(value, kind):
    if type(value) is not kind:
        raise TypeError(f"the solution returned {type(value).__name__} where {kind.__name__} is required")
    return value


def _unary(name):
    return lambda self: _client.request(name, self)


def _binary(name):
    return lambda self, other: _client.request(name, self, other)


def _comparison(name):
    def compare(self, other):
        # Delegated only between two solution objects: a solution object compared with a plain
        # value is never equal (or ordered), so an always-true __eq__ cannot pass an assertion.
        if not isinstance(other, Remote):
            return NotImplemented
        return bool(_client.request(name, self, other))

    return compare


for _name in ("iter", "next", "neg", "pos", "abs", "invert"):
    setattr(Remote, f"__{_name}__", _unary(_name))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Remote, f"__{_name}__", _comparison(_name))
for _name in "add sub mul truediv floordiv mod pow matmul and_ or_ xor lshift rshift getitem".split():
    dunder = _name.rstrip("_")
    setattr(Remote, f"__{dunder}__", _binary(_name))
    if _name != "getitem":
        setattr(Remote, f"__r{dunder}__", _binary("r" + _name))


class Client:
    def __init__(self, sock, process):
        self.sock = sock
        self.process = process
        self.dead = None

    def _as_ref(self, value):
        if isinstance(value, Remote):
            return ["r", value._rid]
        raise TypeError(f"a {type(value).__name__} cannot be passed to the solution process")

    def _from_ref(self, data):
        return Remote(data[1], data[2])

    def request(self, kind, target, *args, kwargs=None):
        if self.dead:
            raise SolutionError(self.dead)
        message = [kind, 0 if target is None else target._rid, [encode(a, self._as_ref) for a in args]]
        if kind == "call":
            message.append([[k, encode(v, self._as_ref)] for k, v in (kwargs or {}).items()])
        try:
            send(self.sock, message)
            reply = recv(self.sock)
        except (OSError, EOFError, ValueError) as exc:
            self.dead = f"the solution process is gone: {exit_description(self.process)} ({exc})"
            raise SolutionError(self.dead) from None
        if reply[0] == "ok":
            return decode(reply[1], self._from_ref)
        _, name, message_text, remote_traceback = reply
        kind_ = getattr(builtins, name, None)
        if isinstance(kind_, type) and issubclass(kind_, Exception) and kind_ is not SystemExit:
            try:
                exc = kind_(message_text)
            except Exception:
                exc = SolutionError(f"{name}: {message_text}")
        else:
            exc = SolutionError(f"{name}: {message_text}")
        exc.add_note("in the solution process:\n" + remote_traceback)
        raise exc


_client = None


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


def run_tests(spec, result_fd, ours, process):
    """The test process: `process` is the solution process's pid, `ours` our end of its socket."""
    global _client
    send(ours, spec["limits"])  # the files are written: the solution process may import now
    _client = Client(ours, process)
    sys.stdout = sys.stderr  # prints of the tests go to stderr; results never go to a stream

    def record(name, passed, detail=""):
        line = json.dumps({"name": name, "passed": passed, "detail": detail[-600:]})
        os.write(result_fd, (line + "\n").encode())

    try:
        names = _client.request("names", None)
    except BaseException:
        record("import solution", False, traceback.format_exc(limit=3))
        names = None
    if names is not None:
        namespace = dict(names)
        for call, expected in spec["examples"]:
            try:
                got, want = eval(call, namespace), eval(expected, namespace)
                record(f"example: {call}", got == want, f"got {got!r}, expected {want!r}")
            except BaseException:
                record(f"example: {call}", False, traceback.format_exc(limit=2))
        if spec["tests"]:
            namespace.update(__name__="fleet_tests")
            try:
                exec(compile(spec["tests"], "tests.py", "exec"), namespace)
            except BaseException:
                record("tests (top level)", False, traceback.format_exc(limit=3))
            else:
                functions = [(k, v) for k, v in namespace.items() if k.startswith("test_") and callable(v)]
                functions = [(k, v) for k, v in functions if not isinstance(v, Remote)]
                if not functions:
                    record("tests (top level)", True)
                for name, function in functions:
                    try:
                        function()
                        record(name, True)
                    except BaseException:
                        record(name, False, traceback.format_exc(limit=3))
    ours.close()
    solution_exit = exit_description(process)
    os.write(result_fd, (json.dumps({"done": True, "solution": solution_exit}) + "\n").encode())
    os._exit(0)


# --- setup, common to both modes ---


def set_limits(limits):
    mb = 1024 * 1024
    for kind, value in (
        (resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1)),
        (resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2),
        (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["max_file_mb"] * mb,) * 2),
        (resource.RLIMIT_NOFILE, (256, 256)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(kind, value)


def write_files(files):
    for name, text in files.items():
        path = os.path.join(WORK, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def main():
    mode, spec_fd = sys.argv[1], int(sys.argv[2])
    if mode == "tests":
        result_fd = int(sys.argv[3])
        ours, theirs = socket.socketpair()
        process = os.fork()  # before the spec is read: the solution process never holds it
        if process == 0:
            os.close(spec_fd)
            os.close(result_fd)
            ours.close()
            try:
                serve(theirs)
            finally:
                os._exit(0)
        theirs.close()
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        with os.fdopen(spec_fd, "rb") as f:
            spec = json.loads(f.read())
        write_files(spec["files"])
        set_limits(spec["limits"])
    except BaseException as exc:
        print(f"sandbox setup failed: {exc!r}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    if mode == "tests":
        run_tests(spec, result_fd, ours, process)
    python = sys.executable
    os.execve(python, [python, "-B", "-E", "-s", "main.py"], spec["env"])


if __name__ == "__main__":
    main()

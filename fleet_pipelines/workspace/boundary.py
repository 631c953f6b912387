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
  names: a function becomes a stub whose calls are requests.

On the wire of `init.py` plain data crosses by value (exact builtin types, rebuilt on arrival).
Any other object of the code stays in the code process and crosses as a **handle** (`Handle`):
its attributes, calls, iteration, len, str and context manager are requests, while every
operator with an operand of the tests compares, in the test process, the exact builtin value the
object holds (a namedtuple's tuple); an object that holds none fails the test as one that
"cannot cross" (`NotPlainData`), which the plan on the base commit records (`sandbox_job.py`).
The tests' own callables cross the other way as **callbacks**: the code calls them, and they run
in the test process with what the code passed; a class of the tests that derives from the
code's, or a plain one handed to a decorator of the code, is made in the code process with its
methods as callbacks. The outcomes go, one JSON line each, to a pipe only the test process
holds.
"""

import ast
import builtins
import collections.abc
import contextlib
import copy
import dis
import functools
import importlib
import importlib.machinery
import importlib.util
import json
import linecache
import logging  # 3 ms in each code process: what the code logs crosses (`Logged`)
import marshal
import math
import operator
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
    return next((base.__name__ for base in cls.__mro__ if builtin_class(base)), cls.__name__)


def builtin_class(value):
    """`value` where it is a builtin class (`int`, `IndexError`): it crosses by name, as the
    receiving process's own; else None."""
    if isinstance(value, type) and getattr(builtins, value.__name__, None) is value:
        return value
    return None


def _zone(tz):
    """A `datetime.timezone` (or None) as plain parts; TypeError for any other tzinfo."""
    import datetime

    if tz is None:
        return None
    if type(tz) is not datetime.timezone:
        raise TypeError("a tzinfo of its own class")
    offset = tz.utcoffset(None)
    return [offset.days, offset.seconds, offset.microseconds, tz.tzname(None)]


def _zone_of(parts):
    import datetime

    if parts is None:
        return None
    days, seconds, microseconds, name = parts
    return datetime.timezone(datetime.timedelta(days, seconds, microseconds), name)


# The standard library's immutable value types: they cross by value, as plain parts rebuilt by the
# receiving process's own class (never unpickled), so a date the code returns equals the test's.
# Their modules are imported when such a value first crosses (a code process starts ~8 ms sooner).
VALUE_MODULES = frozenset({"datetime", "decimal", "fractions", "uuid", "pathlib"})


@functools.cache
def value_codecs():
    """{class: (name, encode, decode)} of the value types."""
    import datetime
    import decimal
    import fractions
    import pathlib
    import uuid

    return {
        datetime.date: ("date", lambda v: [v.year, v.month, v.day], lambda p: datetime.date(*p)),
        datetime.datetime: (
            "datetime",
            lambda v: [*v.timetuple()[:6], v.microsecond, v.fold, _zone(v.tzinfo)],
            lambda p: datetime.datetime(*p[:7], fold=p[7], tzinfo=_zone_of(p[8])),
        ),
        datetime.time: (
            "time",
            lambda v: [v.hour, v.minute, v.second, v.microsecond, v.fold, _zone(v.tzinfo)],
            lambda p: datetime.time(*p[:4], fold=p[4], tzinfo=_zone_of(p[5])),
        ),
        datetime.timedelta: (
            "timedelta",
            lambda v: [v.days, v.seconds, v.microseconds],
            lambda p: datetime.timedelta(*p),
        ),
        datetime.timezone: ("timezone", _zone, _zone_of),
        decimal.Decimal: ("Decimal", lambda v: [str(v)], lambda p: decimal.Decimal(str(p[0]))),
        fractions.Fraction: (
            "Fraction",
            lambda v: [v.numerator, v.denominator],
            lambda p: fractions.Fraction(*p),
        ),
        uuid.UUID: ("UUID", lambda v: [str(v)], lambda p: uuid.UUID(str(p[0]))),
        pathlib.PurePosixPath: (
            "PurePosixPath",
            lambda v: [str(v)],
            lambda p: pathlib.PurePosixPath(str(p[0])),
        ),
        pathlib.PosixPath: ("PosixPath", lambda v: [str(v)], lambda p: pathlib.PosixPath(str(p[0]))),
    }


VALUE_TAGS = ("bi", "r", "v")


def by_value(value):
    """The tag of a value that crosses by value beside init.py's plain data: a builtin class
    (`["bi", name]`), a range (`["r", start, stop, step]`) or a standard-library value
    (`["v", type, parts]`); None for anything else."""
    if builtin_class(value):
        return ["bi", value.__name__]
    kind = type(value)
    if kind is range:
        return ["r", value.start, value.stop, value.step]
    codec = value_codecs().get(kind) if kind.__module__ in VALUE_MODULES else None
    if codec is not None:
        with contextlib.suppress(TypeError):
            return ["v", codec[0], codec[1](value)]
    return None


def from_value(wire, data):
    """The value a `by_value` tag names, rebuilt by this process's own classes."""
    tag = data[0]
    try:
        if tag == "bi" and len(data) == 2 and builtin_class(getattr(builtins, str(data[1]), None)):
            return getattr(builtins, data[1])
        if tag == "r" and len(data) == 4 and all(type(x) is int for x in data[1:]):
            return range(*data[1:])
        decoders = {name: decode for name, _, decode in value_codecs().values()} if tag == "v" else {}
        if len(data) == 3 and data[1] in decoders and type(data[2]) is list:
            return decoders[data[1]](data[2])
    except (TypeError, ValueError, ArithmeticError):
        pass
    raise wire.NotPlainData(f"malformed value (tag {str(tag)[:20]!r})")


def builtin_exception(name, kind=Exception):
    """The builtin exception class `name` names where it derives from `kind`, else Exception:
    all that crosses of an exception raised on the other side."""
    found = getattr(builtins, str(name), None)
    return found if isinstance(found, type) and issubclass(found, kind) else Exception


def pack(wire, value, depth, item):
    """A builtin list, tuple or dict for the wire, its items through `item(v, depth)` and its keys
    as plain data; None for any other value (or one nested deeper than the wire allows)."""
    kind, d = type(value), depth + 1
    if depth >= wire.MAX_DEPTH:
        return None
    if kind is list or kind is tuple:
        return ["t" if kind is tuple else "l", [item(v, d) for v in value]]
    if kind is dict:
        return ["d", [[wire.encode(k), item(v, d)] for k, v in value.items()]]
    return None


def unpack(wire, data, depth, item):
    """The list, tuple or dict `pack` made, its items through `item(v, depth)`; None for any other
    data."""
    if not (type(data) is list and len(data) == 2 and data[0] in ("l", "t", "d") and type(data[1]) is list):
        return None
    if depth > wire.MAX_DEPTH:
        raise wire.NotPlainData(f"nested deeper than {wire.MAX_DEPTH}")
    if data[0] == "d":
        pairs = [p for p in data[1] if type(p) is list and len(p) == 2]
        return {wire.decode(k): item(v, depth + 1) for k, v in pairs}
    items = [item(v, depth + 1) for v in data[1]]
    return tuple(items) if data[0] == "t" else items


SHARED_TYPES = (list, dict, set, bytearray)
MAX_SHARED_ITEMS = 1_000  # a bigger container of the tests crosses as a copy (each message checks each)


class Shared:
    """The tests' mutable containers that the code under test holds (exact lists, dicts, sets and
    bytearrays of at most MAX_SHARED_ITEMS items), by reference as Python passes them: each
    process has its own object under one number (the test process's), `["ref", number, content]`
    the first time it crosses and `["ref", number]` after, either way. Before each message between
    the processes, the sender says in a "sync" what changed in its own since the last, and the
    receiver makes it so in place: a list the code sorts in place, a dict a cache decorator
    fills, a log it appends to are the test's to read after the call, and what the test changes
    is the code's to see at its next request. What they hold crosses as any value does (the
    code's objects as handles); a container the code makes crosses as a copy. The code process
    forgets a container it no longer holds (`unheld`), and the test process with it. A change is
    found by the identity of each item (and key), never by an item's own `==`: a list of the code
    in a shared one, changed in place on a later request, is not seen (it is not theirs to share)."""

    def __init__(self, wire, item, convert):
        self.wire, self.item, self.convert = wire, item, convert  # give/share, receive/take
        self.entries = {}  # number -> [container, its items as last synced (`shallow`)]
        self.numbers = {}  # id(container) -> number
        self.referenced = set()  # numbers the message being made names (the code process's)
        self.busy = False

    def number(self, value):
        """`value`'s number, if it is a container of the tests here (by identity: an id of a
        container gone may be another object's now)."""
        number = self.numbers.get(id(value))
        entry = self.entries.get(number)
        return number if entry is not None and entry[0] is value else None

    def add(self, number, value):
        self.entries[number] = [value, None]
        self.numbers[id(value)] = number

    def settle(self, number):
        """The container as it is now is what the other side has."""
        self.entries[number][1] = shallow(self.entries[number][0])

    def content(self, value, depth=0):
        packed = pack(self.wire, value, depth, self.item)  # a list's or dict's items: handles, refs
        return self.wire.encode(value) if packed is None else packed

    def fill(self, value, data, depth=0):
        """`value` made, in place, what `data` (a content) says."""
        new = unpack(self.wire, data, depth, self.convert)
        new = self.wire.decode(data) if new is None else new
        if type(new) is not type(value):
            raise self.wire.NotPlainData(f"a {type(value).__name__} of the tests cannot become another type")
        if type(value) is list or type(value) is bytearray:
            value[:] = new
        else:
            value.clear()
            value.update(new)

    def changes(self):
        """[number, content] of each container whose content changed here since the last sync."""
        if self.busy:  # a request made while finding them (a handle found again by name) adds none
            return []
        self.busy = True
        try:
            return self.changed()
        finally:
            self.busy = False

    def changed(self):
        updates = []
        for number, entry in list(self.entries.items()):
            try:
                now = shallow(entry[0])
            except RuntimeError:  # changed while read (a thread of the code): at the next message
                continue
            if same_items(now, entry[1]):
                continue
            try:
                updates.append([number, self.content(entry[0])])
            except Exception:  # it holds what cannot cross now, or changed while read (a thread of
                continue  # the code): the other side keeps its own until the next message
            entry[1] = now
        return updates

    def apply(self, updates, forgotten):
        if type(updates) is not list or type(forgotten) is not list:
            raise self.wire.NotPlainData("a malformed sync")
        for update in updates:
            entry = self.entries.get(update[0]) if type(update) is list and len(update) == 2 else None
            if entry is None or type(update[0]) is not int:
                raise self.wire.NotPlainData("a sync of no container of the tests")
            self.fill(entry[0], update[1])
            self.settle(update[0])
        for number in forgotten:
            entry = self.entries.pop(number, None) if type(number) is int else None
            if entry is not None:
                self.numbers.pop(id(entry[0]), None)

    def unheld(self):
        """The numbers of the containers nothing but this registry holds, but those the message
        being made names (the code process's: dropped once their last change is sent)."""
        named, self.referenced = self.referenced, set()
        gone = [
            n for n, entry in list(self.entries.items()) if sys.getrefcount(entry[0]) <= 2 and n not in named
        ]
        for number in gone:
            self.numbers.pop(id(self.entries.pop(number)[0]), None)
        return gone

    def send(self, sock, message, forget=False):
        """`message` on `sock`, after a sync of what changed here since the last (with `forget`,
        and of the containers this side no longer holds: the code process's)."""
        updates = self.changes()
        forgotten = self.unheld() if forget else []
        if updates or forgotten:
            self.wire.send(sock, ["sync", updates, forgotten])
        self.wire.send(sock, message)

    def recv(self, sock, dropped=()):
        """The next message on `sock`, the syncs before it made so here (one that raises one of
        `dropped` is left out)."""
        while True:
            message = self.wire.recv(sock)
            if not (type(message) is list and len(message) == 3 and message[0] == "sync"):
                return message
            with contextlib.suppress(*dropped):
                self.apply(message[1], message[2])


def shallow(container):
    """What `same_items` compares: a container's items (a dict's keys and values) as they are."""
    if type(container) is dict:
        return (list(container), list(container.values()))
    return bytes(container) if type(container) is bytearray else list(container)


def same_items(now, before):
    if before is None or type(now) is bytes:
        return now == before
    if type(now) is tuple:
        return same_items(now[0], before[0]) and same_items(now[1], before[1])
    return len(now) == len(before) and all(a is b for a, b in zip(now, before, strict=True))


def qualified(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


# A subclass of a builtin type (a namedtuple, an int enum) has the builtin value it holds, read
# through the builtin type's own methods (its class cannot answer for itself): the value the
# tests compare against.
PLAIN_OF = (
    (int, lambda v: int.__int__(v)),
    (float, lambda v: float.__float__(v)),
    (str, lambda v: str.__str__(v)),
    (bytes, lambda v: bytes.__bytes__(v)),
    (tuple, lambda v: tuple(tuple.__iter__(v))),
    (list, lambda v: list(list.__iter__(v))),
    (dict, lambda v: dict(dict.items(v))),
    (frozenset, lambda v: frozenset(frozenset.__iter__(v))),
    (set, lambda v: set(set.__iter__(v))),
)
ITERATION_END = ["end"]
# `in` decided by iterating the container, as Python does for a class without __contains__ and as
# collections.abc's mixins do (a Mapping's by its keys' lookup): the tests iterate it and compare
# each item themselves (`Handle.__contains__`). A class's own __contains__ would be handed the
# value the test looks for.
ITERATING_MIXINS = tuple(
    abc.__contains__
    for abc in (
        collections.abc.Sequence,
        collections.abc.Mapping,
        collections.abc.KeysView,
        collections.abc.ItemsView,
        collections.abc.ValuesView,
    )
)
# The arithmetic the test side computes on plain values (`Handle`'s operators), and so the operators
# a class of the code that defines them for itself keeps from crossing (`CodeSide.plain`).
BINARY = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**"}
BINARY |= {
    "lshift": "<<",
    "rshift": ">>",
    "and": "&",
    "or": "|",
    "xor": "^",
    "matmul": "@",
    "divmod": "divmod()",
}
UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert}
UNARY |= {"round": round, "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil}
ARITHMETIC = (*(f"__{r}{n}__" for n in BINARY for r in ("", "r")), *(f"__{n}__" for n in UNARY))
# What the code computes itself where no value of the tests takes part, as a method of its own:
# arithmetic between two of its objects (pyparsing's `Forward() << Word(alphas)`, in place too:
# `expr <<= other`) and an operator of one alone (`~expr`, `-duration`). With an operand of the
# tests, the test side computes on plain values (`Handle`): the code is never handed one.
CODE_OPERATORS = {n: getattr(operator, f"{n}_" if n in ("and", "or") else n) for n in BINARY if n != "divmod"}
CODE_OPERATORS |= {f"i{n}": getattr(operator, f"i{n}") for n in BINARY if n != "divmod"}
CODE_OPERATORS |= {"divmod": divmod, **UNARY}
MAX_NAMES = 10_000  # attribute names of a class a class of the tests derives from, at most
MAX_SAID = 100  # warnings of one request that cross, at most
MAX_SAID_CHARS = 100_000  # characters of a warning's text, and of a request's stdout and stderr


class Logged(logging.Handler):
    """The code process's log records, as the wire carries them: the logger's name, the level, the
    message made (text only, no traceback), where; and whether the code's own levels below the
    root enable it (None: the tests' levels decide). On the root logger while a request is
    answered (`CodeSide.reply`), its records those of the innermost request (None: none)."""

    def __init__(self):
        super().__init__(logging.NOTSET)
        self.records = None

    def emit(self, record):
        if self.records is None or len(self.records) >= MAX_SAID:
            return
        logger, own = logging.getLogger(record.name), None
        while logger is not None and logger.parent is not None and own is None:
            own, logger = (logger.level or None), logger.parent
        enabled = None if own is None else record.levelno >= own
        text = record.getMessage()[:MAX_SAID_CHARS]
        where = [str(record.pathname)[:500], int(record.lineno or 0), str(record.funcName)[:200]]
        self.records.append([str(record.name)[:200], int(record.levelno), text, *where, enabled])


def said(stream):
    """What the code printed to `stream`, its head and tail where it is long."""
    text = stream.getvalue()
    if len(text) <= MAX_SAID_CHARS:
        return text
    half = MAX_SAID_CHARS // 2
    return f"{text[:half]}\n...[{len(text) - 2 * half} characters cut]...\n{text[-half:]}"


MAX_STATE = 100_000  # characters of an exception's arguments and attributes on the wire, at most


class CodeSide:
    """The code process's half of the wire: the objects the test process holds handles to (by
    number, kept alive for the process's life), and what it sends the test process's way.

    Values cross as init.py's plain data, with more tags: `["h", number, label, kind]` for an
    object of the code (kind: the builtin type it derives from, else "t" a class, "c" another
    callable, "dN" an instance of the class of the tests' numbered N (`derive`), "" the rest;
    a fifth item: a frozen record's class and fields, `record`) and, from the test process,
    `["cb", number]` for a callable of the tests (`Callback`), `["it", number]` for an iterator
    of the tests (`TestIterator`), `["in", number]` for another iterable of theirs
    (`TestIterable`), `["tc", number, name, members]` for a plain class of theirs made here,
    `["n", "module:name"]` for a function of the code (or a typing form) the tests hold by name,
    `["mod", name]` for a module they hold, and both ways `by_value`'s tags (a builtin class, a
    range, a standard-library value). Before a reply, a `["said", warnings, stdout, stderr,
    log records]` message carries what the code said while it answered (`reply`)."""

    def __init__(self, wire, sock):
        self.wire = wire
        self.sock = sock
        self.objects = {}
        self.numbers = {}
        self.derived = {}  # id -> a class made here for the tests (`derive`): its instances say so
        self.callbacks = {}  # number -> Callback
        self.classes = {}  # number -> a plain class of the tests, made here (`Boundary.tests_class`)
        self.logged = Logged()  # what the code logs while it answers (`reply`)
        self.shared = Shared(wire, lambda v, d: self.share(v, d), self.take)

    def send(self, message):
        """`message` to the test process, after what changed in the tests' containers here and
        which of them this process no longer holds."""
        self.shared.send(self.sock, message, forget=True)

    def recv(self):
        """The test process's next message; a sync of what this process cannot make so (a
        container it never received) is left out rather than ending the process."""
        return self.shared.recv(self.sock, (self.wire.NotPlainData, TypeError, ValueError, IndexError))

    def handle(self, value):
        number = self.numbers.get(id(value))
        new = number is None
        if new:
            number = len(self.objects) + 1
            self.objects[number], self.numbers[id(value)] = value, number
        if isinstance(value, type):
            return ["h", number, f"class {qualified(value)}"[:200], "t"]
        base = next((b.__name__ for b, _ in PLAIN_OF if issubclass(type(value), b)), "")
        if not base and self.derived.get(id(type(value))) is type(value):
            base = f"d{self.handle(type(value))[1]}"  # an instance of a class of the tests' (`derive`)
        tag = ["h", number, qualified(type(value))[:200], base or ("c" if callable(value) else "")]
        if new and not base:  # its fields as it crosses first, where it is a frozen record
            record = self.record(value)
            return tag if record is None else [*tag, record]
        return tag

    def member(self, spec):
        """A member of a class the tests derive (`derive`): a value, a method of the tests (called
        back: a function here, so that it binds as one), a static or class method, a property of
        them, or a plain nested class of such members (marshmallow's `class Meta`)."""
        tag, data = spec
        if tag == "v":  # a function of the tests a decorator of the code gave back: a method too
            value = self.take(data)
            return as_method(value) if type(value) is Callback else value
        if tag == "k":
            return type(str(data[0]), (), {str(k): self.member(v) for k, v in data[1]})
        if tag == "p":
            return property(*(None if d is None else as_method(self.take(d)) for d in data))
        function = as_method(self.take(data))
        return {"f": function, "s": staticmethod(function), "c": classmethod(function)}[tag]

    def derive(self, name, bases, members, keywords):
        """A class of the tests that derives from classes of the code, made here by the code's
        own metaclass (as the class statement would make it): its methods are the tests',
        called back."""
        namespace = {str(k): self.member(v) for k, v in members}
        keywords = {str(k): self.take(v) for k, v in keywords}
        made = types.new_class(
            str(name), tuple(self.take(b) for b in bases), keywords, lambda n: n.update(namespace)
        )
        self.derived[id(made)] = made
        return ["ok", self.share(made)]

    def share(self, value, depth=0, handles=True):
        """`value` as plain data where it is (`by_value`'s values too); containers of the builtin
        types with the code's objects in them item by item; anything else as a handle (without
        `handles`: NotPlainData). A container of the tests crosses back as itself."""
        wire = self.wire
        number = self.shared.number(value)
        if number is not None:
            self.shared.referenced.add(number)
            return ["ref", number]
        if not (self.shared.entries and type(value) in (list, tuple, dict)):  # none of theirs inside
            try:
                return wire.encode(value)
            except wire.NotPlainData:
                pass
        tagged = by_value(value)
        if tagged is not None:
            return tagged
        try:
            packed = pack(wire, value, depth, lambda v, d: self.share(v, d, handles))
        except wire.NotPlainData:  # a key that is an object of the code: the dict is one
            packed = None
        if packed is not None:
            return packed
        if not handles:
            raise wire.NotPlainData(f"a {qualified(type(value))} holds no plain value")
        return self.handle(value)

    def take(self, data, depth=0):
        """A value the test process sent: plain data, handles back to their objects, callables
        of the tests as `Callback`s."""
        wire = self.wire
        if type(data) is list and data and data[0] in VALUE_TAGS:
            return from_value(wire, data)
        if type(data) is list and len(data) == 2 and data[0] == "n" and type(data[1]) is str:
            module_name, _, attr = data[1].partition(":")  # a function the tests hold by name
            return getattr(importlib.import_module(module_name), attr)
        if type(data) is list and len(data) == 4 and data[0] == "tc" and type(data[1]) is int:
            made = self.classes.get(data[1])  # a plain class of the tests, made here once
            if made is None:
                made = self.classes[data[1]] = self.member(["k", data[2:]])
                self.derived[id(made)] = made
            return made
        if type(data) is list and len(data) == 2 and data[0] == "mod" and type(data[1]) is str:
            return importlib.import_module(data[1])  # a module the tests hold (marshmallow's render_module)
        if type(data) is list and len(data) == 4 and data[0] == "cb" and type(data[1]) is int:
            known = self.callbacks.get(data[1])  # one object a callable: what the code sets on it stays
            if known is None:
                known = self.callbacks[data[1]] = Callback(self, data[1], data[2], data[3])
            return known
        if type(data) is list and len(data) in (2, 3) and data[0] == "ref" and type(data[1]) is int:
            return self.take_shared(data, depth)
        if type(data) is list and len(data) == 2 and data[0] in ("h", "it", "in") and type(data[1]) is int:
            if data[0] in ("it", "in"):
                return (TestIterator if data[0] == "it" else TestIterable)(self, data[1])
            if data[1] not in self.objects:
                raise wire.NotPlainData("a handle of no object of the code under test")
            return self.objects[data[1]]
        unpacked = unpack(wire, data, depth, self.take)
        return wire.decode(data) if unpacked is None else unpacked

    def take_shared(self, data, depth):
        """A container of the tests: the one this process holds under its number, or a new one
        (registered before its items are read: it may hold itself)."""
        shared = self.shared
        if len(data) == 2:
            entry = shared.entries.get(data[1])
            if entry is None:
                raise self.wire.NotPlainData("a container of the tests this process does not hold")
            return entry[0]
        content = data[2]
        if type(content) is list and len(content) == 2 and content[0] in ("l", "d"):
            value = [] if content[0] == "l" else {}
            shared.add(data[1], value)
            shared.fill(value, content, depth)
        else:
            value = self.wire.decode(content)
            if type(value) not in SHARED_TYPES:
                raise self.wire.NotPlainData("a container of the tests of no mutable type")
            shared.add(data[1], value)
        shared.settle(data[1])
        return value

    def plain(self, value):
        """The builtin value an object of a builtin type's subclass holds, as plain data, with the
        arithmetic operators its class defines for itself; None for any other object."""
        for base, read in PLAIN_OF:
            if issubclass(type(value), base):
                own = [n for n in ARITHMETIC if getattr(type(value), n, None) is not getattr(base, n, None)]
                try:
                    return ["ok", self.share([read(value), own], handles=False)]
                except self.wire.NotPlainData:
                    return None
        return None

    def record(self, value):
        """The exact class and the compared fields of a frozen object whose `==` is the one
        dataclasses or attrs generated (the fields' tuples compared, for objects of one exact
        class), as plain data and handles, read as the object first crosses: the test process
        compares two such objects by them (`_equality`), and what the code does to an object
        after it crossed (once the test has made the expected one) changes nothing there. None
        for any other object, a mutable one, and one whose attrs field compares by a key of its
        own."""
        cls = type(value)
        owner = next((c for c in cls.__mro__ if "__eq__" in vars(c)), object)
        made = getattr(getattr(vars(owner)["__eq__"], "__code__", None), "co_filename", "")
        params = vars(owner).get("__dataclass_params__")
        if made == "<string>" and params is not None and params.frozen:  # dataclasses' exec
            fields = owner.__dataclass_fields__.values()
            names = [f.name for f in fields if f.compare and f._field_type.name == "_FIELD"]
        elif made.startswith("<attrs generated") and "__attrs_attrs__" in vars(owner):
            fields = owner.__attrs_attrs__
            frozen = getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"
            if not frozen or any(getattr(a, "eq_key", None) is not None for a in fields):
                return None
            names = [a.name for a in fields if a.eq]
        else:
            return None
        try:
            return self.share([cls, [getattr(value, n) for n in names]])
        except Exception:  # a field that cannot be read: no record, so it cannot be compared
            return None

    def answer(self, request):
        wire = self.wire
        kind, name = request[0], request[1]
        if kind == "import":
            importlib.import_module(name)
            return ["ok", None]
        if kind == "derive":
            return self.derive(name, *request[2:5])
        if kind in ("get", "call"):
            module_name, _, attr = name.partition(":")
            module = importlib.import_module(module_name)
            if kind == "call":
                args = [self.take(a) for a in request[2]]
                kwargs = {k: self.take(v) for k, v in request[3]}
                return ["ok", self.share(getattr(module, attr)(*args, **kwargs))]
            if attr == "__all__" and not hasattr(module, "__all__"):
                return ["ok", wire.encode([n for n in vars(module) if not n.startswith("_")])]
            value = getattr(module, attr)
            if isinstance(value, types.ModuleType):  # the repository's: imported by the tests' finder
                return ["module", value.__name__, self.handle(value)]
            if isinstance(value, type) and issubclass(value, Exception):
                return ["exception", qualified(value), builtin_base(value)]
            if callable(value) and not isinstance(value, type):
                return ["callable"]
            return ["ok", self.share(value)]
        if type(name) is not int or name not in self.objects:
            raise wire.NotPlainData("a handle of no object of the code under test")
        value = self.objects[name]
        rest = [self.take(a) for a in request[2:]]
        if kind == "plain":
            return self.plain(value) or ["none"]
        if kind == "attr":
            return ["ok", self.share(getattr(value, str(rest[0])))]
        if kind == "setattr":
            setattr(value, str(rest[0]), rest[1])
        elif kind == "delattr":
            delattr(value, str(rest[0]))
        elif kind == "hcall":
            return ["ok", self.share(value(*rest[0], **dict(rest[1])))]
        elif kind == "item":
            return ["ok", self.share(value[rest[0]])]
        elif kind == "setitem":
            value[rest[0]] = rest[1]
        elif kind == "delitem":
            del value[rest[0]]
        elif kind == "iter":
            return ["ok", self.share(iter(value))]
        elif kind == "next":
            try:
                return ["ok", self.share(next(value))]
            except StopIteration:  # the iteration's end, said as such: never an exception that crosses
                return ITERATION_END
        elif kind == "operator":  # arithmetic of objects of the code alone: no value of the tests
            return ["ok", self.share(CODE_OPERATORS[rest[0]](value, *rest[1:]))]
        elif kind == "super":  # a method of the tests' class calls its base's (`super().name`)
            return ["ok", self.share(getattr(super(value, rest[0]), str(rest[1])))]
        elif kind == "names":  # what a class of the tests deriving from this one would inherit
            return ["ok", wire.encode([n for n in dir(value) if type(n) is str][:MAX_NAMES])]
        elif kind == "copy":  # made by the code's own copy protocol, in this process
            return ["ok", self.share(copy.deepcopy(value) if rest[0] else copy.copy(value))]
        elif kind in ("len", "bool", "str", "repr", "format", "isinstance", "membership"):
            return ["ok", wire.encode(self.ask(kind, value, rest))]
        elif kind == "enter":
            return ["ok", self.share(type(value).__enter__(value))]
        elif kind == "exit":  # only the exception's builtin class: never a value or a traceback
            raised = None if rest[0] is None else builtin_exception(rest[0], BaseException)
            type(value).__exit__(value, raised, None, None)
        else:
            raise ValueError(f"unknown request {kind!r}")
        return ["ok", None]

    def ask(self, kind, value, rest):
        """What a builtin function makes of an object of the code, as an exact builtin value."""
        answer = {
            "len": len,
            "bool": bool,
            "str": str,
            "repr": repr,
            "format": lambda v: format(v, str(rest[0])),
            "isinstance": lambda v: isinstance(rest[0], v),
            "membership": lambda v: (
                not hasattr(type(v), "__contains__") or type(v).__contains__ in ITERATING_MIXINS
            ),
        }[kind](value)
        if type(answer) not in (int, bool, str):
            raise TypeError(f"{kind}() of a {qualified(type(value))} did not give a builtin value")
        return answer

    def reply(self, request):
        """The reply to one request, after what the code warned, printed and logged while it ran
        (`said`): the test process warns, prints and logs it again, where pytest's `warns`,
        `recwarn`, `capsys`, `caplog` and warning filters see it, as in plain pytest."""
        import io
        import warnings

        out, err, logged = io.StringIO(), io.StringIO(), self.logged
        outer, logged.records = logged.records, []  # a callable of the tests may ask again, within
        root = logging.getLogger()
        level = root.level
        if outer is None:
            root.setLevel(logging.NOTSET)  # every record made (setLevel: the loggers' caches too)
            root.addHandler(logged)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    answer = self.answered(request)
        finally:
            records, logged.records = logged.records, outer
            if outer is None:
                root.removeHandler(logged)
                root.setLevel(level)
        if caught or out.tell() or err.tell() or records:
            warned = [self.warning(w) for w in caught[:MAX_SAID]]
            self.send(["said", warned, said(out), said(err), records])
        return answer

    @staticmethod
    def warning(caught):
        """A warning as the wire carries it: its class's name and nearest builtin class, its text,
        and where it was raised (the module's name too, for the tests' filters)."""
        filename = str(caught.filename)
        module = next(
            (n for n, m in list(sys.modules.items()) if getattr(m, "__file__", None) == filename),
            os.path.splitext(os.path.basename(filename))[0],
        )
        category = caught.category
        return [
            qualified(category),
            builtin_base(category),
            str(caught.message)[:MAX_SAID_CHARS],
            filename[:500],
            int(caught.lineno or 0),
            module,
        ]

    def answered(self, request):
        """The answer to one request, or the exception it raised."""
        import traceback

        wire = self.wire
        try:
            if type(request) is not list or len(request) < 2 or type(request[0]) is not str:
                raise wire.NotPlainData("malformed request")
            return self.answer(request)
        except wire.NotPlainData as exc:
            return ["not plain", str(exc)]
        except BaseException as exc:
            text, where = str(exc)[:2000], traceback.format_exc(limit=4)[-2000:]
            base = builtin_base(type(exc))
            try:  # its arguments and attributes, as values and handles (`e.value.code` in a test)
                state = self.share([list(exc.args), {k: v for k, v in vars(exc).items() if type(k) is str}])
                if len(json.dumps(state)) > MAX_STATE:
                    state = None
            except Exception:
                state = None
            if base == type(exc).__name__ or not isinstance(exc, Exception):
                return ["err", base, text, where, state]
            return ["raised", base, qualified(type(exc)), text, where, state]  # the tests catch it by name

    def call_back(self, number, args, kwargs):
        """A call of a callable of the tests: sent to the test process, whose requests are
        answered until its result comes."""
        message = [
            "cb",
            number,
            [self.share(a) for a in args],
            [[k, self.share(v)] for k, v in kwargs.items()],
        ]
        self.send(message)
        while True:
            request = self.recv()
            if type(request) is list and len(request) == 2 and request[0] == "cbok":
                return self.take(request[1])
            if type(request) is list and len(request) == 4 and request[0] == "cberr":
                raise self.raised_by_tests(*request[1:])
            self.send(self.reply(request))

    def raised_by_tests(self, base, name, args):
        """What a callable of the tests raised, as this process raises it: one of the code's
        exception classes (a method of the tests' schema raising marshmallow's
        `ValidationError`, which the code catches) with its plain arguments; else only the
        builtin class, no text."""
        parts = name.split(".") if type(name) is str and name else []
        for split in range(len(parts) - 1, 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:split]))
                for part in parts[split:]:
                    found = getattr(found, part)
            except (ImportError, AttributeError):
                continue
            if isinstance(found, type) and issubclass(found, Exception) and type(args) is list:
                with contextlib.suppress(Exception):
                    return found(*self.take(["l", args]) if args else ())
            break
        return builtin_exception(base)("raised by a callable of the tests")


def as_method(callback):
    """A callable of the tests as a function of this process: it binds as a method does."""

    def method(*args, **kwargs):
        return callback(*args, **kwargs)

    ours = ("_side", "_number", "__name__", "__qualname__", "__signature__")
    method.__dict__.update({k: v for k, v in vars(callback).items() if k not in ours})  # the code's marks
    method.__name__ = method.__qualname__ = getattr(callback, "__name__", "method")
    if hasattr(callback, "__signature__"):
        method.__signature__ = callback.__signature__
    return method


class Callback:
    """A callable of the tests, as the code under test holds it: calling it calls it in the test
    process, with what the code passes (plain data and handles) and nothing else. Its name and
    its parameters' names and kinds are known here (`inspect.signature` works); defaults read as
    a placeholder."""

    def __init__(self, side, number, name="", shape=None):
        self._side, self._number = side, number
        if type(name) is str and name.isidentifier():
            self.__name__ = self.__qualname__ = name
        import inspect

        with contextlib.suppress(TypeError, ValueError):
            placeholder = inspect.Parameter.empty
            self.__signature__ = inspect.Signature(
                [
                    inspect.Parameter(n, inspect._ParameterKind(k), default=PLACEHOLDER if d else placeholder)
                    for n, k, d in shape
                ]
            )

    def __call__(self, *args, **kwargs):
        return self._side.call_back(self._number, args, kwargs)

    def __repr__(self):
        return "<a callable of the tests>"


PLACEHOLDER = object()  # a default of a callable of the tests, as the code sees it


class TestIterator(Callback):
    """An iterator of the tests (a generator a test passes to the code): each `next` is a call
    back; the tests' iterator ending ends this one."""

    __test__ = False  # not a pytest class

    def __iter__(self):
        return self

    def __next__(self):
        return self()

    def __repr__(self):
        return "<an iterator of the tests>"


class TestIterable(Callback):
    """An iterable of the tests that is no iterator (a deque, a dict view, a class of the tests):
    each `iter` is a call back, which gives a `TestIterator`."""

    __test__ = False  # not a pytest class

    def __iter__(self):
        return self()

    def __repr__(self):
        return "<an iterable of the tests>"


def serve(wire_path, fd, paths, cwd):
    """The code process: the repository after the standard library and the environment."""
    wire = load_wire(wire_path)
    sys.path.extend(paths)
    os.chdir(cwd)
    builtins.exit = builtins.quit = sys.exit
    side = CodeSide(wire, socket.socket(fileno=fd))
    while True:
        try:
            request = side.recv()
        except EOFError:
            return
        side.send(side.reply(request))


# --- the test process ---


NO_VALUE = object()  # a reply of "none" (no plain value) or "end" (the iteration is over)
# Callables of the tests the code under test never receives: they run code, reach files,
# processes or modules of the test process, or read and change any object's attributes.
REFUSED_BUILTINS = ("eval", "exec", "compile", "__import__", "breakpoint", "open", "input")
REFUSED_BUILTINS += ("getattr", "setattr", "delattr", "globals", "locals", "vars")
REFUSED_MODULES = frozenset(
    {"os", "posix", "io", "_io", "sys", "subprocess", "_posixsubprocess", "shutil", "importlib"}
    | {"ctypes", "_ctypes", "pickle", "_pickle", "marshal", "runpy", "socket", "_socket", "signal"}
    | {"_signal", "pty", "fcntl", "mmap", "resource", "pathlib", "tempfile", "code", "codeop"}
)


CONTAINERS = (dict, list, set, frozenset, tuple, str, bytes, bytearray, collections.abc.Mapping)


def callable_shape(value):
    """A callable's name and its parameters' names and kinds (whether each has a default, never
    the default: it may be a value the test compares against), for the code's introspection
    (`inspect.signature`: toolz's curry counts the arguments)."""
    import inspect

    name = getattr(value, "__name__", None)
    try:
        parameters = inspect.signature(value).parameters.values()
    except (TypeError, ValueError):
        return [name if type(name) is str else "", None]
    shape = [[p.name, int(p.kind), p.default is not p.empty] for p in parameters]
    return [name if type(name) is str else "", shape]


def refused_callable(value):
    """Why a callable of the tests cannot be handed to the code under test ("" if it can)."""
    if any(value is getattr(builtins, name) for name in REFUSED_BUILTINS):
        return f"the builtin {value.__name__}"
    module = getattr(value, "__module__", None)
    if not isinstance(module, str):
        module = getattr(type(getattr(value, "__self__", None)), "__module__", "")
    if module.partition(".")[0] in REFUSED_MODULES:
        return f"a callable of {module}"
    return ""


class Handle:
    """An object of the code under test as the tests hold it: its number in the code process.

    Using it asks the code process (an attribute, a call, iteration, len, str, repr, a context
    manager's enter and exit). Every operator with an operand of the tests (`==`, `<`, `in`,
    arithmetic, pytest.approx through them) first turns the object into the exact builtin value
    it holds (a subclass of a builtin type: a namedtuple, an int enum), read by the builtin type's
    own methods, and computes here: the code never receives the value the test compares against.
    `in` with a container that holds none iterates it, where Python or a collections.abc mixin
    would too, and compares each item here.
    An object that holds no such value, or whose class defines that arithmetic itself, fails the
    test as one that cannot cross (NotPlainData). A code context manager receives only the
    exception's builtin class and never suppresses it."""

    __slots__ = ("_fleet_boundary", "_fleet_generation", "_fleet_kind", "_fleet_label", "_fleet_number")
    __slots__ += ("_fleet_origin", "_fleet_local", "_fleet_record")

    def __init__(self, boundary, number, label, kind, local=None):
        fields = {"boundary": boundary, "number": number, "label": label, "kind": kind, "origin": ""}
        fields["local"] = local  # a class of the tests' (`derive`): its class here, for super()
        fields["record"] = None  # a frozen record's class and fields as it crossed (`CodeSide.record`)
        for name, value in (*fields.items(), ("generation", boundary.generation)):
            object.__setattr__(self, f"_fleet_{name}", value)

    def _fleet_ask(self, kind, *args):
        boundary = self._fleet_boundary
        result = boundary.request([kind, boundary.number_of(self), *boundary.gives(args)])
        boundary.used([self], kind, result)
        return result

    def _fleet_held(self):
        """The plain value the object holds and the arithmetic operators its class defines for
        itself, or NO_VALUE."""
        held = self._fleet_ask("plain")
        if held is NO_VALUE:
            return NO_VALUE
        if not (type(held) is list and len(held) == 2 and type(held[1]) is list):
            raise self._fleet_boundary.wire.NotPlainData("a malformed plain value from the code under test")
        return held

    def _fleet_plain(self, what, operators=()):
        """The plain value, for `what` on the test side; NotPlainData where there is none, or where
        the object's class computes one of `operators` itself (the test side would compute
        something else: tomlkit's `Integer - 1` is an `Integer`)."""
        held = self._fleet_held()
        NotPlain = self._fleet_boundary.wire.NotPlainData
        if held is NO_VALUE:
            raise NotPlain(
                f"{what} with a {self._fleet_label} of the code under test, which holds no plain value "
                "(the tests can compare its attributes, its str() or what its methods return)"
            )
        if any(name in held[1] for name in operators):
            raise NotPlain(
                f"{what} with a {self._fleet_label} of the code under test, whose class computes {what} "
                "itself: only the plain value it holds crosses, so the tests cannot compute it"
            )
        return held[0]

    def __getattribute__(self, attr):
        if attr in ("__doc__", "__module__"):  # the code object's, not this class's
            return object.__getattribute__(self, "_fleet_ask")("attr", attr)
        return object.__getattribute__(self, attr)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__") and attr not in HANDLE_DUNDERS:
            raise AttributeError(attr)
        return self._fleet_ask("attr", attr)

    def __setattr__(self, attr, value):
        self._fleet_ask("setattr", attr, value)

    def __delattr__(self, attr):
        self._fleet_ask("delattr", attr)

    def __call__(self, *args, **kwargs):  # the arguments one by one: their list is the wire's, not a test's
        boundary = self._fleet_boundary
        given = boundary.gives([*args, *kwargs.values()])
        named = [[boundary.wire.encode(k), v] for k, v in zip(kwargs, given[len(args) :], strict=True)]
        made = boundary.request(["hcall", boundary.number_of(self), ["l", given[: len(args)]], ["d", named]])
        return boundary.made_by(made, self, args, kwargs)

    def __getitem__(self, key):
        return self._fleet_ask("item", key)

    def __setitem__(self, key, value):
        self._fleet_ask("setitem", key, value)

    def __delitem__(self, key):
        self._fleet_ask("delitem", key)

    def __iter__(self):
        iterator = self._fleet_ask("iter")
        if not isinstance(iterator, Handle):
            raise self._fleet_boundary.wire.NotPlainData("iter() of the code under test gave no iterator")
        while (item := iterator._fleet_ask("next")) is not NO_VALUE:
            yield item

    def __next__(self):
        item = self._fleet_ask("next")
        if item is NO_VALUE:
            raise StopIteration  # the code's iterator said it is over: never a StopIteration of the code
        return item

    def __len__(self):
        return self._fleet_ask("len")

    def __bool__(self):
        held = self._fleet_held()
        return bool(held[0]) if held is not NO_VALUE else self._fleet_ask("bool")

    def __str__(self):
        return self._fleet_ask("str")

    def __format__(self, spec):
        return self._fleet_ask("format", spec)

    def __repr__(self):
        try:
            return self._fleet_ask("repr")
        except Exception:
            return f"<a {self._fleet_label} of the code under test>"

    def __instancecheck__(self, value):
        return self._fleet_ask("isinstance", value)

    def __enter__(self):
        return self._fleet_ask("enter")

    def __exit__(self, kind, value, traceback):
        self._fleet_ask("exit", None if kind is None else builtin_base(kind))
        return False

    def __copy__(self):
        return self._fleet_ask("copy", False)

    def __deepcopy__(self, memo):
        return self._fleet_ask("copy", True)

    @property
    def __class__(self):  # isinstance(x, tuple) holds for a namedtuple of the code; type(x) is Handle
        return self._fleet_local or PLAIN_CLASSES.get(self._fleet_kind, Handle)

    def __mro_entries__(self, bases):  # a class of the tests derives from this one: `Deriving`
        return (type.__new__(Deriving, "deriving", (), {"__module__": __name__}),)

    def __reduce_ex__(self, protocol):
        raise self._fleet_boundary.wire.NotPlainData(
            f"a {self._fleet_label} of the code under test cannot be pickled by the tests"
        )

    def __contains__(self, item):
        """`in` on the plain value the object holds; else, where the object's membership is by
        iteration (`ITERATING_MIXINS`), by iterating it and comparing each item here."""
        held = self._fleet_held()
        if held is not NO_VALUE:
            return (item._fleet_plain("in") if isinstance(item, Handle) else item) in held[0]
        if not self._fleet_ask("membership"):
            raise self._fleet_boundary.wire.NotPlainData(
                f"in with a {self._fleet_label} of the code under test, which holds no plain value and "
                "decides membership itself: its __contains__ would be handed the value looked for"
            )
        return any(element is item or element == item for element in self)

    def __hash__(self):  # the plain value's, else the object's identity (a class as a typing key)
        held = self._fleet_held()
        return hash(held[0]) if held is not NO_VALUE else object.__hash__(self)


class Deriving(type):
    """The metaclass of a class statement of the tests whose bases are classes of the code:
    the class is made in the code process (`Boundary.derive`), by the code's own metaclass, and
    the name binds its handle (marshmallow's tests derive their schemas and fields). Where its
    bases mix classes of the tests in, or a member cannot cross, the bases are stand-ins
    (`stand_in`): the class is defined, not usable."""

    def __new__(mcs, name, bases, namespace, **keywords):
        original = namespace.get("__orig_bases__", bases)
        handles = [b for b in original if isinstance(b, Handle)]
        boundary = handles[0]._fleet_boundary
        try:
            if len(handles) != len(original) or any(
                h._fleet_boundary is not boundary or h._fleet_kind != "t" for h in handles
            ):
                raise boundary.wire.NotPlainData("a class of the tests among the bases")
            return boundary.derive(name, handles, namespace, keywords)
        except boundary.wire.NotPlainData:
            stand_ins = tuple(stand_in(b) if isinstance(b, Handle) else b for b in original)
            return types.new_class(name, stand_ins, keywords, lambda n: n.update(namespace))


def bridge(handle):
    """The test side's class for a class the tests derived (`Boundary.derive`), which the
    handles of its instances give as their `__class__`, so that `super()` works in the tests'
    methods: each name the class has but its own dunders (and `SUPER_DUNDERS`) is the base's, as
    `super(cls, obj).name` gives it in the code process."""
    boundary = handle._fleet_boundary

    class Inherited:
        def __set_name__(self, owner, name):
            self.name = name

        def __get__(self, instance, owner=None):
            if instance is None:
                return getattr(handle, self.name)
            return boundary.request(
                ["super", boundary.number_of(handle), *boundary.gives([instance, self.name])]
            )

    names = handle._fleet_ask("names")
    inherited = {n: Inherited() for n in names if not n.startswith("__") or n in SUPER_DUNDERS}
    return type(f"{handle._fleet_label} (of the code under test)", (), inherited)


SUPER_DUNDERS = frozenset({"__init__", "__post_init__", "__call__", "__repr__", "__str__", "__getattr__"})
SUPER_DUNDERS |= {"__getitem__", "__setitem__", "__delitem__", "__iter__", "__len__", "__enter__", "__exit__"}


def stand_in(handle):
    """The base a class of the tests gets where it derives from a class of the code (semver's
    conftest imports one): the class statement runs, so the module that holds it is collected and
    its other tests run. Making an instance, or reaching what the class would inherit from the
    code's class (`Sub.parse`, `super().parse` in a classmethod: each of the code class's
    attributes but its dunders is a stand-in's descriptor), fails as cannot cross: the code's
    methods would run on an object of the tests. The error is an AttributeError too, so that
    pytest's probes (`getattr(cls, "setup_class", None)`) find nothing."""
    NotPlain = handle._fleet_boundary.wire.NotPlainData
    why = f"a class of the tests derives from a {handle._fleet_label} of the code under test: not usable"

    class NotInherited(NotPlain, AttributeError):
        pass

    class Inherited:
        def __set_name__(self, owner, name):
            self.name = name

        def __get__(self, instance, owner=None):
            raise NotInherited(f"{why} ({self.name})")

    class StandInType(type):
        def __getattr__(cls, name):
            raise NotInherited(f"{why} ({cls.__qualname__}.{name})")

        def __call__(cls, *args, **kwargs):
            raise NotPlain(f"{why} ({cls.__qualname__}())")

    names = handle._fleet_ask("names")
    inherited = {n: Inherited() for n in names if not (n.startswith("__") and n.endswith("__"))}
    return StandInType(f"{handle._fleet_label} (of the code under test)", (), inherited)


PLAIN_CLASSES = {base.__name__: base for base, _ in PLAIN_OF}
HANDLE_DUNDERS = frozenset({"__name__", "__qualname__", "__module__", "__doc__", "__dict__", *PLAIN_DUNDERS})


def _operands(handle, other, symbol, operators=()):
    """The plain values `handle` and `other` hold, to be compared or computed in the tests; None
    where `handle` holds none and `other` is a class or a typing construct of the tests (compared
    by identity by nature, never one of the code: `other` decides, as Python lets the other
    operand; typing's `arg in (Any, ...)` on a class of the code)."""
    if isinstance(other, Handle):
        return handle._fleet_plain(symbol, operators), other._fleet_plain(symbol, operators)
    if handle._fleet_held() is NO_VALUE and (isinstance(other, type) or type(other).__module__ == "typing"):
        return None
    return handle._fleet_plain(symbol, operators), other


def _binary(function, symbol, operators=(), reflected=False, name=""):
    """An operator on the test side (`_operands`); arithmetic (`name`) with another object of the
    code is the code's own (`CODE_OPERATORS`)."""

    def method(self, other):
        if name and not reflected and isinstance(other, Handle):
            return self._fleet_ask("operator", name, other)
        values = _operands(self, other, symbol, operators)
        if values is None:
            return NotImplemented
        return function(values[1], values[0]) if reflected else function(*values)

    return method


def _in_place(name):
    """`a op= b`: the code's own with another object of the code; else Python's fallback to the
    plain operator (`a = a op b`, on the test side)."""

    def method(self, other):
        return self._fleet_ask("operator", name, other) if isinstance(other, Handle) else NotImplemented

    return method


def _unary(function, symbol, name):
    """An operator of the object alone is the code's own (no value of the tests takes part);
    `round(x, n)`, with an operand of the tests, on the test side."""

    def method(self, *args):
        if not args:
            return self._fleet_ask("operator", name)
        return function(self._fleet_plain(symbol, (f"__{name}__",)), *args)

    return method


def _equality(same):
    """== (same: True) or != on the test side: one object of the code is equal to itself (as a
    container's comparison holds it; an enum member's equality); two frozen ones whose `==`
    dataclasses or attrs generated are equal where they are of one exact class and their
    compared fields, as they crossed, are equal (`CodeSide.record`); any other pair is compared
    by the plain values they hold."""
    compare = _binary(operator.eq if same else operator.ne, "==" if same else "!=")

    def method(self, other):
        boundary = self._fleet_boundary
        if isinstance(other, Handle) and boundary.number_of(other) == boundary.number_of(self):
            return same
        records = (self._fleet_record, other._fleet_record) if type(other) is Handle else (None, None)
        if records[0] is not None and records[1] is not None:  # frozen records: as they crossed
            kinds = [c if type(c) is not Handle else boundary.number_of(c) for c, _ in records]
            equal = kinds[0] == kinds[1] and records[0][1] == records[1][1]
            return equal if same else not equal
        return compare(self, other)

    return method


Handle.__eq__, Handle.__ne__ = _equality(True), _equality(False)
for _name, _symbol in (("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")):
    setattr(Handle, f"__{_name}__", _binary(getattr(operator, _name), _symbol))
for _name, _symbol in BINARY.items():
    _function = CODE_OPERATORS[_name]
    _own = (f"__{_name}__", f"__r{_name}__")
    setattr(Handle, f"__{_name}__", _binary(_function, _symbol, _own, name=_name))
    setattr(Handle, f"__r{_name}__", _binary(_function, _symbol, _own, reflected=True))
    if _name != "divmod":
        setattr(Handle, f"__i{_name}__", _in_place(f"i{_name}"))
for _name, _function in UNARY.items():
    setattr(Handle, f"__{_name}__", _unary(_function, f"{_name}()", _name))
for _name, _function in (("int", int), ("float", float), ("complex", complex), ("index", operator.index)):
    setattr(Handle, f"__{_name}__", lambda self, f=_function, w=f"{_name}()": f(self._fleet_plain(w)))


# The code process's program: boundary.py compiled once per job (`code_side`), read from a pipe on
# its stdin, which is then /dev/null again, as it was when the source came on its command line.
CODE_LOADER = (
    "import marshal, os, sys\n"
    "_fleet_code = marshal.loads(sys.stdin.buffer.read())\n"
    "_fleet_null = os.open(os.devnull, os.O_RDONLY)\n"
    "os.dup2(_fleet_null, 0)\n"
    "os.close(_fleet_null)\n"
    "exec(_fleet_code)\n"
)


@functools.cache
def code_side(source):
    """boundary.py as the code process runs it, compiled (marshal: ours to the code, never the
    other way): once per job, in the job before it forks its test processes, not in each code
    process (40 ms each on a slow 2-core machine, and each hidden test function starts one)."""
    return marshal.dumps(compile(source, "boundary.py", "exec"))


class Boundary:
    """The test process's side: the code process (started on first use) and its socket."""

    def __init__(self, wire, wire_path, source, paths, cwd, env):
        self.wire = wire
        self.source = source
        self.wire_path = wire_path
        self.paths = paths  # after the standard library: the environment, then the repository
        self.cwd = cwd
        self.env = env
        self.sock = self.process = None
        self.dead = ""
        self.exceptions = {}
        self.names = frozenset()  # the repository's top-level module names (RepositoryFinder's)
        self.stubs = {}  # the code's functions as the tests hold them: stub -> "module:name"
        self.generation = 0  # of the code process: a handle of an earlier one names nothing
        self.handles = {}  # number -> Handle, this code process's
        self.callbacks = []  # the tests' callables handed to this code process
        self.given = {}  # id -> (callable, its reference): one number for one callable of the tests
        self.shared = Shared(wire, self.give, self.receive)  # the tests' containers the code holds
        self.shared_made = 0
        self.pending = None  # pytest's outcome raised in a callable of the tests, raised again after
        self.collected = False  # the test modules are imported: what they made, they made (`made_by`)
        self.tests_root = ""  # where the tests' own modules are (`tests_class`)
        self.classes_given = 0  # the tests' plain classes made in this code process

    def exception_class(self, name, base):
        """The test process's own class for the repository's exception class `name` (one per
        name), derived from its nearest builtin exception class (RuntimeError for StopIteration
        and the other control-flow classes, `init.CONTROL_FLOW`). The code's names are only
        labels: nothing but a builtin exception class is ever looked up by them."""
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
        argv = [sys.executable, "-I", "-S", "-B", "-c", CODE_LOADER, "serve", self.wire_path]
        argv += [str(theirs.fileno()), json.dumps(self.paths), self.cwd]
        process = subprocess.Popen(
            argv,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
            cwd="/",
            start_new_session=True,  # its process group ends with it (`restart`)
        )
        theirs.close()
        with contextlib.suppress(OSError):  # one that died first is told by its socket, as before
            process.stdin.write(code_side(self.source))
        with contextlib.suppress(OSError):
            process.stdin.close()
        # kept, and waited for in `restart`: a Popen dropped while its process runs warns
        # (ResourceWarning), an error under a project's `filterwarnings = error` (toolz)
        self.sock, self.process = ours, process

    @property
    def pid(self):
        """The code process's pid (None: none started)."""
        return self.process.pid if self.process is not None else None

    def restart(self):
        """Ends the code process (its next request starts a fresh one): nothing the code kept in
        memory reaches the next test, and the handles of its objects name nothing."""
        if self.sock is not None:
            self.sock.close()
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait()  # reaped already by `exit_description`: Popen takes that as done
        self.sock = self.process = None
        self.dead = ""
        self.generation += 1
        self.handles.clear()
        self.callbacks.clear()
        self.given.clear()
        self.classes_given = 0
        self.shared = Shared(self.wire, self.give, self.receive)

    def request(self, message):
        wire = self.wire
        if self.dead:
            raise wire.SolutionError(self.dead)
        if self.sock is None:
            self.start()
        try:
            self.send(message)
            while True:
                reply = self.recv()
                if type(reply) is list and len(reply) == 5 and reply[0] == "said":
                    self.said(*reply[1:])  # what the code warned and printed meanwhile
                    continue
                if not (type(reply) is list and len(reply) == 4 and reply[0] == "cb"):
                    break
                self.send(self.call_back(reply))  # the code calls a callable of the tests
        except (OSError, EOFError, ValueError) as exc:
            self.dead = f"the code under test is gone: {wire.exit_description(self.pid)} ({exc})"
            raise wire.SolutionError(self.dead) from None
        if self.pending is not None:  # pytest's skip or fail, raised in a callable of the tests
            pending, self.pending = self.pending, None
            raise pending
        if type(reply) is list and len(reply) == 2 and reply[0] == "ok":
            value = self.receive(reply[1])
            if message[0] == "get" and isinstance(value, Handle):
                object.__setattr__(value, "_fleet_origin", message[1])  # found again after a restart
            return value
        if reply in (["none"], ["end"]):
            return NO_VALUE
        if reply == ["callable"] and message[0] == "get":
            return self.stub(message[1])
        if type(reply) is list and len(reply) == 3 and reply[0] == "module" and message[0] == "get":
            if type(reply[1]) is str and reply[1].partition(".")[0] in self.names:
                return importlib.import_module(reply[1])  # through the finder: a proxy
            return self.receive(reply[2])
        if type(reply) is list and len(reply) == 2 and reply[0] == "not plain" and type(reply[1]) is str:
            raise wire.NotPlainData(f"the code under test returned {reply[1][:200]}")
        strings = type(reply) is list and all(type(x) is str for x in reply[:-1])
        if (
            strings
            and len(reply) == 3
            and type(reply[2]) is str
            and reply[0] == "exception"
            and message[0] == "get"
        ):
            return self.exception_class(reply[1][:300], reply[2])
        if strings and len(reply) == 6 and reply[0] == "raised":
            exc = self.exception_class(reply[2][:300], reply[1])(reply[3])
            exc.add_note("in the code under test:\n" + reply[4])
            raise self.restore(exc, reply[3], reply[5])
        if strings and len(reply) == 5 and reply[0] == "err":
            exc = wire.remote_exception(*reply[1:4])
            raise self.restore(exc, reply[2], reply[4]) if type(exc).__name__ == reply[1] else exc
        raise wire.NotPlainData("malformed reply from the code under test")

    def said(self, caught, out, err, records):
        """What the code warned, printed and logged while it answered, warned, printed and logged
        here: a warning of a class of the code as the test process's class of that name
        (`exception_class`, the one `pytest.warns(pkg.SomeWarning)` holds), of a builtin class as
        that class; a log record to the logger of its name, where the code's own level, else
        the tests' (`caplog.set_level`), enables it; text only."""
        import logging
        import warnings

        for entry in records if type(records) is list else ():
            if not (
                type(entry) is list and len(entry) == 7 and type(entry[0]) is str and type(entry[1]) is int
            ):
                continue
            name, level, text, pathname, lineno, function, enabled = entry
            logger = logging.getLogger(name) if name != "root" else logging.getLogger()
            if not (enabled if type(enabled) is bool else logger.isEnabledFor(level)):
                continue
            fields = {
                "name": name,
                "levelno": level,
                "levelname": logging.getLevelName(level),
                "msg": str(text),
            }
            fields |= {"pathname": str(pathname), "lineno": lineno if type(lineno) is int else 0}
            logger.handle(logging.makeLogRecord({**fields, "funcName": str(function), "args": None}))

        for entry in caught if type(caught) is list else ():
            if not (type(entry) is list and len(entry) == 6 and all(type(x) is str for x in entry[:4])):
                continue
            name, base, text, filename, lineno, module = entry
            builtin = getattr(builtins, base, None) if base.isidentifier() else None
            if name == f"builtins.{base}" and isinstance(builtin, type) and issubclass(builtin, Warning):
                category = builtin
            else:
                category = self.exception_class(name[:300], base if base.endswith("Warning") else "Warning")
            line = lineno if type(lineno) is int else 0
            warnings.warn_explicit(text, category, filename, line, module=str(module)[:300])
        if type(out) is str and out:
            sys.stdout.write(out)
        if type(err) is str and err:
            sys.stderr.write(err)

    def send(self, message):
        """`message` to the code process, after what changed in the tests' containers it holds."""
        self.shared.send(self.sock, message)

    def recv(self):
        """The code process's next message, what it changed in the tests' containers made so here
        first (a malformed sync fails the test as cannot cross)."""
        return self.shared.recv(self.sock)

    def restore(self, exc, text, state):
        """The code's exception with its arguments and attributes (values and handles); its text
        stays the code's str() of it. Never a name the exception's class has (`add_note`,
        `with_traceback`) or a dunder."""
        try:
            args, attrs = self.receive(state)
        except (self.wire.NotPlainData, TypeError, ValueError):
            return exc
        if type(args) is list:
            exc.args = tuple(args)
            if str(exc) != text:  # a class of the code with its own __str__: its text stays
                exc.args = (text,)
        for name, value in attrs.items() if type(attrs) is dict else ():
            own = type(name) is str and name.isidentifier() and not name.startswith("__")
            if own and not hasattr(type(exc), name):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(exc, name, value)
        return exc

    def call(self, name, args, kwargs):
        given = self.gives([*args, *kwargs.values()])
        named = [list(pair) for pair in zip(kwargs, given[len(args) :], strict=True)]
        return self.made_by(self.request(["call", name, given[: len(args)], named]), name, args, kwargs)

    @contextlib.contextmanager
    def giving(self):
        """One message's `give`s: where one cannot cross, the containers of the tests registered
        for the others are forgotten (the code never receives them)."""
        first = self.shared_made
        try:
            yield
        except BaseException:
            self.shared.apply([], list(range(first + 1, self.shared_made + 1)))
            raise

    def gives(self, values):
        with self.giving():
            return [self.give(v) for v in values]

    def made_by(self, made, callee, args, kwargs):
        """`made`, a new object of the code, with how it was made (`callee`: a handle, or a
        function's "module:name") where that can be done again in a fresh code process: a hidden
        test's module-level object (marshmallow's `schema = UserSchema()`) is made again for each
        hidden test, as importing the module would make it. What a test changed in it since is
        not."""
        self.used([*args, *kwargs.values()])
        if (
            type(made) is Handle
            and not made._fleet_origin
            and self.replayable([callee, *args, *kwargs.values()])
        ):
            object.__setattr__(made, "_fleet_origin", ("call", callee, args, dict(kwargs)))
        return made

    def tests_class(self, value):
        """Whether `value` is a plain class a module of the tests defines (no base, no
        metaclass): handed to the code (attrs' `@attr.s` on it), it is made in the code process
        from its namespace, as a class statement deriving from the code's is (`derive`)."""
        if type(value) is not type or value.__bases__ != (object,):
            return False
        if value.__module__ == HIDDEN_MODULE:
            return True
        path = getattr(sys.modules.get(value.__module__), "__file__", None)
        return bool(self.tests_root and type(path) is str and path.startswith(self.tests_root + os.sep))

    def used(self, values, kind="call", result=None):
        """While the test modules are imported, an object they made that they then change (set an
        attribute or an item, take a method, hand it to the code) is not made again in a fresh
        code process, which would not hold that change: there it names nothing."""
        if self.collected:
            return
        changes = kind in ("setattr", "delattr", "setitem", "delitem", "call")
        changes = changes or (kind == "attr" and type(result) is Handle and result._fleet_kind == "c")
        for value in values if changes else ():
            if type(value) is tuple:  # (a list of the tests is no object the modules made again)
                self.used(value)
            elif type(value) is Handle and type(value._fleet_origin) is tuple:
                object.__setattr__(value, "_fleet_origin", "")

    def replayable(self, values):
        """Whether each of `values` is the same in a fresh code process: an immutable builtin
        value, or a handle that can be found or made again."""
        for value in values:
            if type(value) is tuple:
                if not self.replayable(value):
                    return False
            elif type(value) is Handle:
                if not value._fleet_origin:
                    return False
            elif self.tests_class(value):  # made again in the fresh process as it is handed over
                continue
            elif type(value) not in (str, int, float, bool, bytes, type(None)):
                return False
        return True

    def replay(self, origin):
        """The object a handle held made again in this code process, as it was made first."""
        if origin[0] == "derive":
            return self.derived(*origin[1:])
        _, callee, args, kwargs = origin
        return self.call(callee, args, kwargs) if type(callee) is str else callee(*args, **kwargs)

    def member(self, value):
        """A member of a class of the tests derived from the code's (`derive`), for the wire: a
        method (called back), a static or class method, a property, a plain nested class, or a
        value as `give` gives it."""
        kind = type(value)
        if kind is types.FunctionType:
            return ["f", self.give(value)]
        if kind in (staticmethod, classmethod) and type(value.__func__) is types.FunctionType:
            return ["s" if kind is staticmethod else "c", self.give(value.__func__)]
        if kind is property:
            return ["p", [None if f is None else self.give(f) for f in (value.fget, value.fset, value.fdel)]]
        if kind is type and value.__bases__ == (object,):
            return ["k", [value.__name__, self.members(value)]]
        return ["v", self.give(value)]

    def members(self, cls):
        """A plain class's namespace as `member`s, for the code process to make it again."""
        return [[k, self.member(v)] for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")]

    def derived(self, name, bases, namespace, keywords):
        """The class the code process makes of a class statement of the tests (`Deriving`)."""
        with self.giving():
            skip = ("__orig_bases__", "__classcell__")
            members = [[str(k), self.member(v)] for k, v in namespace.items() if k not in skip]
            named = [[str(k), self.give(v)] for k, v in keywords.items()]
            given = [self.give(b) for b in bases]
        return self.request(["derive", name, given, members, named])

    def derive(self, name, bases, namespace, keywords):
        """A class of the tests that derives from classes of the code (`bases`), made in the code
        process by the code's metaclass: its methods run here, called back with its instances as
        handles, whose `__class__` is a class of this side (`bridge`) so that `super()` reaches
        the base's methods. It is made again in a fresh code process (each hidden test's)."""
        made = self.derived(name, bases, namespace, keywords)
        if type(made) is not Handle or made._fleet_kind != "t":
            raise self.wire.NotPlainData("the code under test made no class of the class statement")
        parents = tuple(b._fleet_local for b in bases if b._fleet_local is not None)
        module, qualname = namespace.get("__module__", __name__), namespace.get("__qualname__", name)
        local = type(name, (bridge(made), *parents), {"__module__": module, "__qualname__": qualname})
        if "__classcell__" in namespace:  # `super()` and `__class__` in its methods
            namespace["__classcell__"].cell_contents = local
        object.__setattr__(made, "_fleet_local", local)
        object.__setattr__(made, "_fleet_origin", ("derive", name, tuple(bases), dict(namespace), keywords))
        return made

    def stub(self, name):
        """A function of the code under test, as the tests hold it (named: pytest's ids and
        outputs show its name)."""

        def call(*args, **kwargs):
            return self.call(name, args, kwargs)

        call.__name__ = call.__qualname__ = name.rpartition(":")[2]
        self.stubs[call] = name
        return call

    def number_of(self, handle):
        """A handle's number in the code process now: a class or function taken from a module is
        found again by its name in a fresh code process; any other object of an earlier one is
        gone."""
        if handle._fleet_generation == self.generation:
            return handle._fleet_number
        if not handle._fleet_origin:
            raise self.wire.NotPlainData(
                f"a {handle._fleet_label} of the code under test made for an earlier test (each hidden "
                "test has a fresh code process)"
            )
        origin = handle._fleet_origin
        found = self.request(["get", origin]) if type(origin) is str else self.replay(origin)
        if type(found) is not Handle:
            what = origin if type(origin) is str else f"a {handle._fleet_label}"
            raise self.wire.NotPlainData(f"{what} is no longer an object of the code")
        object.__setattr__(found, "_fleet_local", handle._fleet_local)
        object.__setattr__(handle, "_fleet_number", found._fleet_number)
        object.__setattr__(handle, "_fleet_generation", self.generation)
        return handle._fleet_number

    def give(self, value, depth=0):
        """What the tests pass to the code, for the wire: plain data (builtin containers item by
        item), handles back to their objects, the code's functions by name, and the tests' own
        callables as numbers (`call_back` runs them); nothing else crosses."""
        wire = self.wire
        kind = type(value)
        if kind is Handle:
            return ["h", self.number_of(value)]
        tagged = by_value(value)
        if tagged is not None:
            return tagged
        if kind is types.FunctionType and value in self.stubs:
            return ["n", self.stubs[value]]
        if getattr(value, "__module__", None) == "typing" and "typing" in sys.modules:  # typing.ClassVar
            name = next((n for n, v in vars(sys.modules["typing"]).items() if v is value), None)
            if name is not None:
                return ["n", f"typing:{name}"]  # the code process's own, by name
        if isinstance(value, types.ModuleType) and type(value.__name__) is str:
            code = kind is RemoteModule  # the repository's, or one of neither side (the environment's)
            if code or (value.__name__.partition(".")[0] not in self.names and value.__name__ in sys.modules):
                return ["mod", value.__name__]  # imported by the code process, there
        if kind in SHARED_TYPES and len(value) <= MAX_SHARED_ITEMS:
            shared = self.shared.number(value)
            if shared is not None:
                return ["ref", shared]
            self.shared_made += 1
            number = self.shared_made  # its items may be containers of the tests too: numbered after it
            self.shared.add(number, value)
            try:
                content = self.shared.content(value, depth)
            except wire.NotPlainData:  # it holds what cannot cross: said below
                self.shared.apply([], [number])
            else:
                self.shared.settle(number)
                return ["ref", number, content]
        packed = pack(wire, value, depth, self.give)
        if packed is not None:
            return packed
        try:
            return wire.encode(value)
        except wire.NotPlainData as exc:
            known = self.given.get(id(value))
            if known is not None and known[0] is value:
                return known[1]
            if self.tests_class(value):  # made in the code process (a decorator of the code's on it)
                try:
                    members = self.members(value)
                except wire.NotPlainData:
                    pass
                else:
                    self.classes_given += 1
                    reference = ["tc", self.classes_given, value.__name__, members]
                    self.given[id(value)] = (value, reference)
                    return reference
            tag = "cb" if callable(value) else "it" if hasattr(kind, "__next__") else "in"
            if tag == "in" and (not hasattr(kind, "__iter__") or issubclass(kind, CONTAINERS)):
                # a container of the tests (a defaultdict, a mapping) would be half of itself
                raise wire.NotPlainData(
                    f"a {kind.__name__} of the tests cannot be passed to the code under test: {exc}"
                ) from None
            called = {"cb": value, "it": getattr(value, "__next__", None), "in": lambda: iter(value)}[tag]
            refusal = refused_callable(value) if tag == "cb" else ""
            if refusal:
                raise wire.NotPlainData(f"{refusal} cannot be passed to the code under test: {exc}") from None
        self.callbacks.append(called)
        reference = [tag, len(self.callbacks) - 1, *(callable_shape(value) if tag == "cb" else ())]
        self.given[id(value)] = (value, reference)
        return reference

    def receive(self, data, depth=0):
        """A value from the code under test: plain data with exact builtin types, its objects as
        handles (one per object)."""
        wire = self.wire
        if type(data) is list and len(data) in (4, 5) and data[0] == "h" and type(data[1]) is int:
            handle = self.handles.get(data[1])
            if handle is None:
                label, kind = str(data[2])[:200], data[3] if data[3] in ("t", "c", *PLAIN_CLASSES) else ""
                local = None  # an instance of a class the tests derived: that class's, here
                if type(data[3]) is str and data[3][:1] == "d" and data[3][1:].isdigit():
                    owner = self.handles.get(int(data[3][1:]))
                    local = owner._fleet_local if owner is not None else None
                handle = self.handles[data[1]] = Handle(self, data[1], label, kind, local)
                if len(data) == 5:
                    record = self.receive(data[4], depth + 1)
                    if type(record) is list and len(record) == 2 and type(record[1]) is list:
                        object.__setattr__(handle, "_fleet_record", record)
            return handle
        if type(data) is list and len(data) == 2 and data[0] == "ref" and type(data[1]) is int:
            entry = self.shared.entries.get(data[1])
            if entry is None:
                raise wire.NotPlainData("the code under test named no container of the tests")
            return entry[0]  # the test's own
        if type(data) is list and data and data[0] in VALUE_TAGS:
            return from_value(wire, data)
        unpacked = unpack(wire, data, depth, self.receive)
        return wire.decode(data) if unpacked is None else unpacked

    def call_back(self, message):
        """A callable of the tests, called by the code under test with what it passed; the reply
        is its result, or its exception's builtin class (no text, no traceback), with the code's
        class and the plain arguments where it is one of the code's (`code_exception`). pytest's
        outcomes (skip, fail) are raised again in the test once the code's call is over, whatever
        the code does with the exception it receives."""
        _, number, args, kwargs = message
        try:
            if not (type(number) is int and 0 <= number < len(self.callbacks)):
                raise self.wire.NotPlainData("a call of no callable of the tests")
            if type(args) is not list or type(kwargs) is not list:
                raise self.wire.NotPlainData("a malformed call of a callable of the tests")
            named = {str(p[0]): self.receive(p[1]) for p in kwargs if type(p) is list and len(p) == 2}
            result = self.callbacks[number](*(self.receive(a) for a in args), **named)
            return ["cbok", *self.gives([result])]
        except BaseException as exc:
            if isinstance(exc, Exception) and not isinstance(exc, self.wire.NotPlainData):
                return ["cberr", builtin_base(type(exc)), *self.code_exception(exc)]
            self.pending = self.pending or exc  # pytest's outcomes, or what cannot cross
            return ["cberr", "Exception", "", []]

    def code_exception(self, exc):
        """The name of the code's exception class whose class here `exc` is (or derives from:
        `exception_class`) and its arguments where they are plain data, for the code to raise
        its own; ("", []) for any other exception, of which only the builtin class crosses."""
        ours = {cls: name for name, cls in self.exceptions.items()}
        name = next((ours[c] for c in type(exc).__mro__ if c in ours), "")
        try:
            return name, [self.wire.encode(a) for a in exc.args] if name else []
        except self.wire.NotPlainData:
            return name, []


class RemoteModule(types.ModuleType):
    """A module of the repository as the tests see it: its names fetched on use."""

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__") and attr not in PLAIN_DUNDERS:
            raise AttributeError(attr)
        boundary = self.__dict__["__spec__"].loader.boundary
        value = boundary.request(["get", f"{self.__name__}:{attr}"])
        if attr == "__all__" and star_import(sys._getframe(1)):
            return star_names(boundary.wire, value, sys._getframe(1))
        fixed = value._fleet_kind in ("t", "c") if isinstance(value, Handle) else callable(value)
        if fixed or isinstance(value, types.ModuleType):
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
    boundary.tests_root = os.path.abspath(cwd)
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
            boundary.collected = True  # what the modules made is made again for each hidden test
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

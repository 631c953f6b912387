"""The suite we ship: small tasks for the non-DEV roles, in HumanEval's form.

Each task is a Python stub with worked `>>>` examples (what the selector may use), a hidden
`check(candidate)` test, and a reference body that passes it (checked in the test suite, as are
empty bodies, which must fail).
"""

from __future__ import annotations

from ..domain.models import Role

FLEET_TASKS: list[dict[str, str]] = [
    {
        "role": Role.DATA,
        "entry_point": "dedupe_latest",
        "prompt": '''def dedupe_latest(rows: list[dict]) -> list[dict]:
    """Keep, for each "id", only the row with the greatest "ts"; return them sorted by "id".

    >>> dedupe_latest([{"id": 2, "ts": 1}, {"id": 1, "ts": 5}, {"id": 2, "ts": 3}])
    [{'id': 1, 'ts': 5}, {'id': 2, 'ts': 3}]
    >>> dedupe_latest([])
    []
    """
''',
        "canonical_solution": """    latest = {}
    for row in rows:
        held = latest.get(row["id"])
        if held is None or row["ts"] > held["ts"]:
            latest[row["id"]] = row
    return [latest[k] for k in sorted(latest)]
""",
        "test": """def check(candidate):
    assert candidate([]) == []
    rows = [{"id": "b", "ts": 2, "v": 1}, {"id": "a", "ts": 1}, {"id": "b", "ts": 9, "v": 2}]
    rows.append({"id": "b", "ts": 4})
    assert candidate(rows) == [{"id": "a", "ts": 1}, {"id": "b", "ts": 9, "v": 2}]
    assert candidate([{"id": 3, "ts": -1}, {"id": 3, "ts": -5}]) == [{"id": 3, "ts": -1}]
    assert candidate([{"id": i % 3, "ts": i} for i in range(10)]) == [
        {"id": 0, "ts": 9}, {"id": 1, "ts": 7}, {"id": 2, "ts": 8}]
""",
    },
    {
        "role": Role.DATA,
        "entry_point": "split_csv_line",
        "prompt": '''def split_csv_line(line: str) -> list[str]:
    """Split one CSV line on commas. A field in double quotes may hold commas, and "" inside
    quotes stands for one double quote. Quotes around a field are removed.

    >>> split_csv_line('a,b,c')
    ['a', 'b', 'c']
    >>> split_csv_line('"x, y",2')
    ['x, y', '2']
    """
''',
        "canonical_solution": """    fields, field, quoted, i = [], [], False, 0
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == '"' and i + 1 < len(line) and line[i + 1] == '"':
                field.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                field.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == ",":
            fields.append("".join(field))
            field = []
        else:
            field.append(ch)
        i += 1
    fields.append("".join(field))
    return fields
""",
        "test": """def check(candidate):
    q = chr(34)
    assert candidate("a,b,c") == ["a", "b", "c"]
    assert candidate(q + "x, y" + q + ",2") == ["x, y", "2"]
    assert candidate("") == [""]
    assert candidate("a,,b,") == ["a", "", "b", ""]
    assert candidate(q + "he said " + 2 * q + "hi" + 3 * q + ",ok") == ["he said " + q + "hi" + q, "ok"]
    assert candidate("1," + q + "a,b,c" + q + ",3") == ["1", "a,b,c", "3"]
""",
    },
    {
        "role": Role.DATA,
        "entry_point": "null_ratio",
        "prompt": '''def null_ratio(rows: list[dict], column: str) -> float:
    """Fraction of rows where `column` is missing or None, rounded to 3 decimals; 0.0 for no rows.

    >>> null_ratio([{"a": 1}, {"a": None}, {}], "a")
    0.667
    >>> null_ratio([], "a")
    0.0
    """
''',
        "canonical_solution": """    if not rows:
        return 0.0
    return round(sum(row.get(column) is None for row in rows) / len(rows), 3)
""",
        "test": """def check(candidate):
    assert candidate([], "x") == 0.0
    assert candidate([{"x": 0}, {"x": ""}, {"x": False}], "x") == 0.0
    assert candidate([{"y": 1}] * 4, "x") == 1.0
    assert candidate([{"x": None}, {"x": 1}, {"x": 2}], "x") == 0.333
    assert candidate([{"x": 1}] * 7 + [{}], "x") == 0.125
""",
    },
    {
        "role": Role.DEVOPS,
        "entry_point": "parse_duration",
        "prompt": '''def parse_duration(text: str) -> int:
    """Seconds in a duration like "1h30m", "45s" or "2d4h" (units d, h, m, s, each at most once,
    in that order). Raise ValueError for anything else, including the empty string.

    >>> parse_duration("1h30m")
    5400
    >>> parse_duration("45s")
    45
    """
''',
        "canonical_solution": """    import re

    match = re.fullmatch(r"(?:(\\d+)d)?(?:(\\d+)h)?(?:(\\d+)m)?(?:(\\d+)s)?", text)
    if not text or match is None:
        raise ValueError(f"bad duration: {text!r}")
    d, h, m, s = (int(g) if g else 0 for g in match.groups())
    return ((d * 24 + h) * 60 + m) * 60 + s
""",
        "test": """def check(candidate):
    assert candidate("1h30m") == 5400
    assert candidate("2d4h") == 187200
    assert candidate("0s") == 0
    assert candidate("90m") == 5400
    assert candidate("1d1h1m1s") == 90061
    for bad in ["", "1x", "h", "30m1h", "1.5h", " 1h"]:
        try:
            candidate(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")
""",
    },
    {
        "role": Role.DEVOPS,
        "entry_point": "bump_version",
        "prompt": '''def bump_version(version: str, part: str) -> str:
    """Bump a semantic version "MAJOR.MINOR.PATCH" at `part` ("major", "minor" or "patch"),
    resetting the lower parts to 0. Raise ValueError for a bad version or part.

    >>> bump_version("1.4.2", "minor")
    '1.5.0'
    >>> bump_version("0.9.9", "patch")
    '0.9.10'
    """
''',
        "canonical_solution": """    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"bad version {version!r}")
    major, minor, patch = (int(p) for p in parts)
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    if part == "patch":
        return f"{major}.{minor}.{patch + 1}"
    raise ValueError(f"bad part {part!r}")
""",
        "test": """def check(candidate):
    assert candidate("1.4.2", "major") == "2.0.0"
    assert candidate("1.4.2", "minor") == "1.5.0"
    assert candidate("1.4.2", "patch") == "1.4.3"
    assert candidate("0.9.9", "patch") == "0.9.10"
    for args in [("1.2", "patch"), ("a.b.c", "major"), ("1.2.3", "build")]:
        try:
            candidate(*args)
        except ValueError:
            continue
        raise AssertionError(f"accepted {args!r}")
""",
    },
    {
        "role": Role.DEVOPS,
        "entry_point": "parse_env",
        "prompt": '''def parse_env(text: str) -> dict[str, str]:
    """Parse a .env file: one KEY=VALUE per line; blank lines and lines starting with # are
    skipped; whitespace around keys and values is stripped; matching single or double quotes
    around a value are removed; a later key overrides an earlier one.

    >>> parse_env("A=1\\n# note\\nB = 'two'")
    {'A': '1', 'B': 'two'}
    """
''',
        "canonical_solution": """    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env
""",
        "test": """def check(candidate):
    assert candidate("") == {}
    assert candidate("A=1\\n# note\\nB = 'two'") == {"A": "1", "B": "two"}
    assert candidate('URL="http://x/?a=b"\\n\\n  # c\\nURL2=y') == {"URL": "http://x/?a=b", "URL2": "y"}
    assert candidate("K=1\\nK=2") == {"K": "2"}
    assert candidate("EMPTY=\\nQ='it''s'") == {"EMPTY": "", "Q": "it''s"}
""",
    },
    {
        "role": Role.QA,
        "entry_point": "boundary_values",
        "prompt": '''def boundary_values(low: int, high: int) -> list[int]:
    """Test inputs for a check that accepts integers in [low, high]: the values just outside,
    on, and just inside each bound, sorted and without duplicates.

    >>> boundary_values(1, 10)
    [0, 1, 2, 9, 10, 11]
    >>> boundary_values(5, 5)
    [4, 5, 6]
    """
''',
        "canonical_solution": """    return sorted({low - 1, low, low + 1, high - 1, high, high + 1})
""",
        "test": """def check(candidate):
    assert candidate(1, 10) == [0, 1, 2, 9, 10, 11]
    assert candidate(5, 5) == [4, 5, 6]
    assert candidate(0, 1) == [-1, 0, 1, 2]
    assert candidate(-3, 3) == [-4, -3, -2, 2, 3, 4]
""",
    },
    {
        "role": Role.QA,
        "entry_point": "killing_inputs",
        "prompt": '''def is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def killing_inputs() -> list[int]:
    """Years to test is_leap with: the list must tell is_leap apart from each of these wrong
    versions (for each, some year in the list gets a different answer), and hold at most 6 years.
    Wrong versions: `year % 4 == 0`; `year % 4 == 0 and year % 100 != 0`; `year % 400 == 0`.

    >>> len(killing_inputs()) <= 6
    True
    """
''',
        "canonical_solution": """    return [1900, 2000, 2024]
""",
        "test": """def check(candidate):
    years = candidate()
    assert isinstance(years, list) and 0 < len(years) <= 6
    assert all(isinstance(y, int) for y in years)
    mutants = [
        lambda y: y % 4 == 0,
        lambda y: y % 4 == 0 and y % 100 != 0,
        lambda y: y % 400 == 0,
    ]
    for mutant in mutants:
        assert any(mutant(y) != is_leap(y) for y in years)
""",
    },
    {
        "role": Role.ARCHITECT,
        "entry_point": "startup_order",
        "prompt": '''def startup_order(deps: dict[str, list[str]]) -> list[str]:
    """Order in which to start services so each starts after the services it depends on;
    among services ready at the same time, alphabetical order. A dependency that is not a key
    is a service too. Raise ValueError when the dependencies form a cycle.

    >>> startup_order({"api": ["db", "cache"], "db": [], "cache": []})
    ['cache', 'db', 'api']
    """
''',
        "canonical_solution": """    import heapq

    nodes = set(deps) | {d for ds in deps.values() for d in ds}
    waiting = {n: set(deps.get(n, [])) for n in nodes}
    ready = [n for n, w in waiting.items() if not w]
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for other, w in waiting.items():
            if node in w:
                w.discard(node)
                if not w:
                    heapq.heappush(ready, other)
    if len(order) != len(nodes):
        raise ValueError("dependency cycle")
    return order
""",
        "test": """def check(candidate):
    assert candidate({}) == []
    assert candidate({"api": ["db", "cache"], "db": [], "cache": []}) == ["cache", "db", "api"]
    assert candidate({"web": ["api"], "api": ["db"]}) == ["db", "api", "web"]
    assert candidate({"b": [], "a": [], "c": ["a"]}) == ["a", "b", "c"]
    for cyclic in [{"a": ["b"], "b": ["a"]}, {"x": ["x"]}]:
        try:
            candidate(cyclic)
        except ValueError:
            continue
        raise AssertionError(f"accepted cycle {cyclic!r}")
""",
    },
    {
        "role": Role.ARCHITECT,
        "entry_point": "token_bucket",
        "prompt": '''def token_bucket(capacity: int, refill_per_s: float, requests: list) -> list[bool]:
    """Simulate a rate limiter: the bucket starts full with `capacity` tokens and gains
    `refill_per_s` tokens per second up to `capacity`; each request (a time in seconds,
    non-decreasing) is allowed and takes one token when at least one token is there.

    >>> token_bucket(2, 1.0, [0, 0, 0, 1.0])
    [True, True, False, True]
    """
''',
        "canonical_solution": """    tokens, last, allowed = float(capacity), None, []
    for t in requests:
        if last is not None:
            tokens = min(capacity, tokens + (t - last) * refill_per_s)
        last = t
        if tokens >= 1:
            tokens -= 1
            allowed.append(True)
        else:
            allowed.append(False)
    return allowed
""",
        "test": """def check(candidate):
    assert candidate(2, 1.0, [0, 0, 0, 1.0]) == [True, True, False, True]
    assert candidate(1, 0.5, [0, 1, 2, 3, 4]) == [True, False, True, False, True]
    assert candidate(3, 10.0, [0, 0, 0, 0, 0.05, 0.1]) == [True, True, True, False, False, True]
    assert candidate(0, 100.0, [0, 1]) == [False, False]
    assert candidate(2, 1.0, []) == []
    assert candidate(1, 1.0, [0, 100, 100]) == [True, True, False]
""",
    },
]

"""The sandbox that runs untrusted Python (proposals' code, hidden tests, repository jobs), for
scoring, repository jobs and the evaluation: `setup` builds it (bubblewrap, seccomp, cgroups,
the uid pool) and names the isolation in force, `run` runs in it, `init` is its trusted pid 1.
"""

from .run import isolation_available, run_python, run_tests, unavailable_warning
from .setup import (
    MOUNT_ROOT,
    TOOL_DIR,
    SandboxResult,
    TestRun,
)

__all__ = [
    "MOUNT_ROOT",
    "TOOL_DIR",
    "SandboxResult",
    "TestRun",
    "isolation_available",
    "run_python",
    "run_tests",
    "unavailable_warning",
]

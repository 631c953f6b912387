"""The limits of one sandboxed run, in the standard library only: the sandbox
(`fleet_pipelines.sandbox`) imports this module and nothing else of the package, so a copy of the
two runs as any user (tests/integration/test_sandbox_*.py run it as uid 65534)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (a proposal's code, its tests, a repository job): what the
    sandbox (`fleet_pipelines.sandbox`) holds a run to; the council's are in `Convened`."""

    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_file_mb: int = 16
    max_output_chars: int = 8_000
    work_dir_mb: int = 64
    cpus: float = 1.0

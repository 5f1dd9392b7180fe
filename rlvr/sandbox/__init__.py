"""Where code_sandbox runs untrusted code: `local` (bubblewrap on this machine) or `e2b` (remote).

Both backends take the same job (a dict of files, one of which is the in-sandbox harness
`runner.py`) and return a `RunResult`; the harness and the verdict parsing are shared, so
the backends differ only in how isolation is obtained.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Limits:
    """Per-run resource limits. `cpu_s` defaults to the wall timeout plus one second.

    `max_output_bytes` caps stdout and stderr each; `max_scratch_mb` bounds everything a
    run may write (its working dir and /tmp share one tmpfs of that size under bwrap).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_procs: int = 32
    max_output_bytes: int = 1 << 20
    max_file_mb: int = 16
    max_scratch_mb: int = 64
    cpu_s: float | None = None


SANDBOX_FAILURES = ("sandbox_setup", "sandbox_lost")
"""`RunResult.killed` values that only the sandbox can cause, never the code in it: the run's
namespace could not be set up (before any untrusted code ran), or the fork server died under
it. code_sandbox turns them into a *failed* verdict; everything else a run ends with (its own
timeout, crash, memory or output limit, exit code) is the solution's and scores."""


@dataclass(slots=True)
class RunResult:
    """What one sandboxed program did. `killed` names why we stopped it (timeout, output_limit)."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    killed: str | None = None
    seconds: float = 0.0
    run_id: str = ""
    info: dict = field(default_factory=dict)

    @property
    def timed_out(self) -> bool:
        return self.killed == "timeout"

"""One exception hierarchy for everything a user can cause.

Every error a user can trigger (bad input, a moved upstream, a dirty tree, no network)
is a PortError: a one-line message naming the problem and a hint naming the fix. The CLI
prints those without a traceback and exits 2; anything else is a bug and keeps its
traceback (the pre-commit model: one fatal-error type, one handler at the top).
"""

from __future__ import annotations


class PortError(Exception):
    """A problem the user can fix. `hint` says how."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class ProjectError(PortError):
    """No project checkout to act on (run outside one, or --project names another folder)."""


class PinError(PortError):
    """The pin file is missing or malformed."""


class ObtainError(PortError):
    """The base tree could not be obtained or verified (network, checksum, commit)."""


class NetworkError(ObtainError):
    """A source could not be reached; `auto` falls back to the next source."""


class PortDescriptionError(PortError):
    """templates/ (port.toml, series/*/commit.toml) is malformed."""


class AnchorError(PortDescriptionError):
    """An anchor matched zero or several times in the upstream file."""


class RenderError(PortDescriptionError):
    """A template failed to render (undefined variable, syntax error)."""


class WorkTreeError(PortError):
    """The tool-owned work tree is in a state the tool will not touch."""


class SeriesError(PortError):
    """The series could not be applied, exported, or differs from patches/."""


class PatchApplyError(SeriesError):
    """`git am -3` rejected a patch; `details` names the patch, the file, the line and the
    rejected hunk (series.apply)."""

    def __init__(self, message: str, hint: str | None = None, details: dict | None = None):
        super().__init__(message, hint)
        self.details = details or {}


class ProcessError(PortError):
    """A command run through the process funnel (llamacpp_mla_port.process) could not start,
    ran past its time-out (killed with its whole group: `timed_out`, `returncode` None) or,
    with check=True, exited non-zero (git: any non-zero exit, process.git). `cmd` is the argument
    list, `stderr_tail` the end of what it wrote to stderr, `stdout_tail` (git only) of stdout."""

    def __init__(self, message: str, hint: str | None = None, cmd: list[str] | None = None,
                 returncode: int | None = None, stderr_tail: str = "", timed_out: bool = False,
                 stdout_tail: str = ""):
        super().__init__(message, hint)
        self.cmd = list(cmd or [])
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.stdout_tail = stdout_tail
        self.timed_out = timed_out


class BuildError(PortError):
    """CMake configure or build failed."""


class GGUFError(PortError):
    """A GGUF file is malformed, truncated or hostile."""


class ConversionError(PortError):
    """A checkpoint could not be converted."""


class ProofError(PortError):
    """A parity or lossless check failed."""


class DeviceCheckError(PortError):
    """The GPU check's bundle cannot be made or its driver cannot run."""

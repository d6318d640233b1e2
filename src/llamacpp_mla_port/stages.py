"""The one stage runner (the proof, the bench, the canary and the device check): named, timed
steps and one report shape, {name: {"ok", "seconds", "error"[, "traceback"], ...what the stage adds}}.

A PortError is a failure the user can act on; any other exception is a bug, recorded with its
traceback so the run still ends with one report.
"""

from __future__ import annotations

import time
import traceback
from typing import Callable

from llamacpp_mla_port.errors import PortError


class StageFailed(Exception):
    """A stage's own failure with its evidence (fields that go into the stage's entry)."""

    def __init__(self, evidence: dict):
        super().__init__(evidence.get("message", ""))
        self.evidence = evidence


class Stages:
    """Runs stages into `entries` (a report's "stages" dict).

    `stop_on_failure`: after the first failure the later stages are not run, but recorded
    as skipped ({"ok": None, "skipped": ...}) by `skip_rest`. `merge`: a stage's returned dict
    goes into its entry (the canary's evidence) instead of being handed back to the caller.
    `budget_s`: seconds for all the stages from now (the device check); a stage that needs
    more than is left is recorded as skipped, not run. `log(name, entry)` is called as each
    stage ends (or is skipped), then `save()`: a run stopped later still leaves its report."""

    def __init__(self, entries: dict, stop_on_failure: bool = False, merge: bool = False,
                 log: Callable[[str, dict], None] | None = None, budget_s: float | None = None,
                 save: Callable[[], None] | None = None):
        self.entries = entries
        self.stop_on_failure = stop_on_failure
        self.merge = merge
        self.log = log
        self.save = save
        self.budget_s = budget_s
        self.started = time.monotonic()
        self.failed: str | None = None          # the first stage that failed

    def remaining(self) -> float:
        """Seconds of the budget left (infinite without one)."""
        return float("inf") if self.budget_s is None else self.budget_s - (time.monotonic() - self.started)

    def run(self, name: str, fn: Callable[[], object], needs_s: float = 0.0):
        """Run one stage; its result (None when it failed, or was not run after a failure or
        for want of time: `needs_s`, about what it takes)."""
        if self.stop_on_failure and self.failed is not None:
            return None
        if self.remaining() < needs_s:
            self.entries[name] = {"ok": None, "skipped": f"not run: {self.remaining():.0f} s of the budget left, "
                                                         f"the stage needs ~{needs_s:.0f} s"}
            self._ended(name)
            return None
        t0 = time.monotonic()
        result = None
        try:
            result = fn()
            entry = {"ok": True, **((result or {}) if self.merge else {})}
        except StageFailed as failed:
            entry = {"ok": False, "error": failed.evidence.get("message", ""), **failed.evidence}
        except PortError as err:
            entry = {"ok": False, "error": str(err), "message": err.message, "hint": err.hint,
                     "kind": type(err).__name__}
        except Exception as err:  # a bug: keep the traceback in the report
            entry = {"ok": False, "error": f"{type(err).__name__}: {err}",
                     "traceback": traceback.format_exc()[-3000:]}
        entry["seconds"] = round(time.monotonic() - t0, 1)
        self.entries[name] = entry
        if not entry["ok"] and self.failed is None:
            self.failed = name
        self._ended(name)
        return None if self.merge or not entry["ok"] else result

    def _ended(self, name: str) -> None:
        if self.log:
            self.log(name, self.entries[name])
        if self.save:
            self.save()

    def fail(self, name: str, error: str, **fields) -> None:
        """Mark a stage that ran as failed after all (its result did not pass a check)."""
        self.entries[name] = {**self.entries.get(name, {}), **fields, "ok": False, "error": error}
        if self.failed is None:
            self.failed = name

    def skip_rest(self, names) -> None:
        """Record every stage of `names` that did not run as skipped."""
        for name in names:
            if name not in self.entries:
                self.entries[name] = {"ok": None, "skipped": f"the {self.failed} stage failed"}
                self._ended(name)

    @property
    def ok(self) -> bool:
        return all(e.get("ok") for e in self.entries.values())

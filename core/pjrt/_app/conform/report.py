"""What a conformance run found: one result per check, as a table for people and JSON for CI."""
from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclasses.dataclass
class CheckResult:
    """The outcome of one check.

    Attributes:
      name: the check's stable dotted name.
      status: ``"pass"``, ``"fail"`` or ``"skip"``.
      detail: what was seen: the plugin's answer on a pass, the reason for a skip, what went
        wrong on a failure (the plugin's error, the signal that killed it, the timeout).
      seconds: how long the check ran.
      signal: the name of the signal that killed the plugin's process during the check.
      timed_out: the check did not finish within the time limit.
    """

    name: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    signal: str | None = None
    timed_out: bool = False

    def to_json(self) -> dict:
        """The result as plain JSON data."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Report:
    """The results of a conformance run against one plugin.

    Attributes:
      plugin: what was asked for (a library path or a platform name).
      library: the shared library that was driven.
      results: one [`CheckResult`][pjrt._app.conform.report.CheckResult] per check that was selected, in run order.
      seconds: the wall time of the whole run.
      info: what the run learned about the plugin (API version, platform...).
    """

    plugin: str
    library: str
    results: list[CheckResult]
    seconds: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when no check failed (skipped checks do not apply to the plugin)."""
        return all(result.status != FAIL for result in self.results)

    def counts(self) -> dict[str, int]:
        """How many checks passed, failed and were skipped."""
        counts = {PASS: 0, FAIL: 0, SKIP: 0}
        for result in self.results:
            counts[result.status] += 1
        return counts

    def result(self, name: str) -> CheckResult:
        """The result of the check ``name`` (KeyError when it was not run)."""
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def failed(self) -> list[str]:
        """Names of the failed checks."""
        return [result.name for result in self.results if result.status == FAIL]

    def to_json(self) -> dict:
        """The report as plain JSON data (see ``docs/vendors.md`` for the fields)."""
        return {"plugin": self.plugin, "library": self.library, "passed": self.passed,
                "seconds": round(self.seconds, 3), "counts": self.counts(), "info": self.info,
                "checks": [result.to_json() for result in self.results]}

    def write_json(self, path: str) -> None:
        """Write `to_json` to ``path``."""
        with open(path, "w", encoding="utf-8") as out:
            json.dump(self.to_json(), out, indent=2)
            out.write("\n")

    def format_table(self, width: int | None = None, *, full: bool = False) -> str:
        """A table of the results, one line per check, and a summary line.

        Args:
          width: the width to wrap details to; the terminal's when None and not ``full``.
          full: keep every detail whole (a pass's too): wrapped to ``width`` when one is
            given, else on one line each, for a reader that is not a terminal (a file, a
            pipe, a CI log) or that asked for everything (``pjrt conform -v``).
        """
        if width is None and not full:
            width = shutil.get_terminal_size((100, 24)).columns
        name_width = max([len(result.name) for result in self.results] + [5])
        lines = [f"pjrt conform {self.plugin}"]
        if self.library and self.library != self.plugin:
            lines.append(f"  library: {self.library}")
        for key, value in self.info.items():
            lines.append(f"  {key}: {value}")
        lines.append("")
        prefix_width = 6 + name_width + 2 + 8 + 2
        for result in self.results:
            mark = {PASS: "PASS", FAIL: "FAIL", SKIP: "skip"}[result.status]
            detail = " ".join(result.detail.split())
            if width is None:
                wrapped = [detail]
            else:
                # Never break inside a word or at its hyphens: a library name such as
                # librocprofiler-sdk.so.1 must stay whole to be searched for.
                wrapped = textwrap.wrap(detail, max(width - prefix_width, 30),
                                        break_long_words=False, break_on_hyphens=False) or [""]
            if not full:
                # On a terminal, a pass needs no more than its headline and a reason four
                # lines; -v (or a pipe) shows them whole.
                wrapped = wrapped[:1] if result.status == PASS else wrapped[:4]
            lines.append(f"{mark:<6}{result.name:<{name_width}}  {result.seconds:>7.2f}s  "
                         f"{wrapped[0]}")
            lines.extend(" " * prefix_width + more for more in wrapped[1:])
        counts = self.counts()
        verdict = "conforms" if self.passed else "DOES NOT CONFORM"
        lines.append("")
        lines.append(f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
                     f"{counts[SKIP]} skipped, in {self.seconds:.1f}s")
        return "\n".join(lines)

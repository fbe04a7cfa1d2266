"""``pjrt conform``: does a PJRT plugin do what a host needs, check by check?

Every check has a stable dotted name (``library.elf``, ``transfer.roundtrip.int4``,
``spmd.shardy``...) and ends as pass, fail or skip (it does not apply to the plugin), with
what was seen and how long it took. Checks run in worker processes, so a plugin that crashes,
aborts or hangs fails the check it was running and the others still run::

    from pjrt._app import conform
    report = conform.run("/path/to/libmy_pjrt_plugin.so", options={"devices": 2})
    print(report.format_table())
    assert report.passed, report.failed()

The command line is ``pjrt conform PLUGIN`` (``pjrt conform --help``); ``docs/vendors.md``
shows how to run it in a plugin's CI.
"""
from ._registry import Check
from .catalog import load_checks, select
from .report import FAIL, PASS, SKIP, CheckResult, Report
from .runner import DEFAULT_TIMEOUT, run

__all__ = ["run", "Report", "CheckResult", "Check", "check_names", "describe", "select", "PASS",
           "FAIL", "SKIP", "DEFAULT_TIMEOUT"]


def check_names() -> list[str]:
    """The names of every check, in the order they run."""
    return list(load_checks())


def describe() -> dict[str, str]:
    """Each check's name and the line saying what it checks."""
    return {name: check.doc for name, check in load_checks().items()}

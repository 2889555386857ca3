"""Under RIFFLE_REQUIRE_ALL=1 (set by .ci/run) a skip is a failure: every skip in these tests
is for something .ci/run installs (torch and torchrun, torchdata, Pillow), so in CI each of
them must run. Elsewhere a skip stays a skip, listed with its reason by pytest -rs and
counted in its last line."""

import os

import pytest

REQUIRE_ALL = os.environ.get("RIFFLE_REQUIRE_ALL") == "1"


def _fail_skip(report):
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under RIFFLE_REQUIRE_ALL=1 (.ci/run installs this): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip(outcome.get_result())

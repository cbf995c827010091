"""Running the contract checks: as a pytest base class, or as a table for the command line."""

from __future__ import annotations

import time
import unittest
from collections.abc import Callable
from dataclasses import dataclass

from ._checks import CHECKS, Check, ContractViolation
from ._kit import BackendKit, kit_for


class ContractSuite:
    """Subclass in a backend's tests to run every contract check as one pytest test each.

    Either name an installed backend that declares its kit (``backend = "torch"``) or
    override :meth:`make_kit`. The class name must start with ``Test`` for pytest::

        class TestMyBackendContract(ContractSuite):
            backend = "mybackend"
    """

    backend: str | None = None

    def make_kit(self) -> BackendKit:
        """The kit the checks run with: the backend's own (``kit_for(backend)``); override it to test a kit
        that is not registered. Raises TypeError when ``backend`` is not set."""
        if self.backend is None:
            raise TypeError(f"{type(self).__name__} must set backend = '<name>' or override make_kit().")
        return kit_for(self.backend)


def _as_test(check: Check) -> Callable[[ContractSuite], None]:
    def test(self: ContractSuite) -> None:
        kit = self.make_kit()
        if check.name in checked_waivers(kit):
            raise unittest.SkipTest(f"waived by the kit: {kit.waived[check.name]}")  # pytest reports it skipped
        check(kit)

    test.__name__ = f"test_{check.group.replace('-', '_')}__{check.name}"
    test.__doc__ = check.rule
    return test


for _check in CHECKS:
    setattr(ContractSuite, _as_test(_check).__name__, _as_test(_check))


@dataclass
class CheckResult:
    check: Check
    error: str | None
    seconds: float
    waived: str | None = None
    """Why the kit waived this check (it was not run); None when it ran."""

    @property
    def passed(self) -> bool:
        """Whether the check ran and passed (no error recorded)."""
        return self.error is None and self.waived is None


def checked_waivers(kit: BackendKit) -> dict[str, str]:
    """``kit.waived``, refused when it names a check that does not exist (a typo would waive nothing)."""
    unknown = sorted(set(kit.waived) - {check.name for check in CHECKS})
    if unknown:
        raise ValueError(f"BackendKit(waived=...) names no check {unknown}; the checks are "
                         f"{sorted(check.name for check in CHECKS)}.")
    return dict(kit.waived)


def run_contract_checks(kit: BackendKit, groups: tuple[str, ...] | None = None) -> list[CheckResult]:
    """Run every check (or those of ``groups``) on ``kit``; a failure is recorded, never raised; a check the kit
    waived is recorded with its reason, not run."""
    results = []
    waived = checked_waivers(kit)
    for check in CHECKS:
        if groups is not None and check.group not in groups:
            continue
        if check.name in waived:
            results.append(CheckResult(check, None, 0.0, waived=waived[check.name]))
            continue
        start = time.perf_counter()
        try:
            check(kit)
            error = None
        except ContractViolation as exc:
            error = str(exc)
        results.append(CheckResult(check, error, time.perf_counter() - start))
    return results

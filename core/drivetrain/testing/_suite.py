"""Running the contract checks: as a pytest base class, or as a table for the command line."""

from __future__ import annotations

import time
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
        check(self.make_kit())

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

    @property
    def passed(self) -> bool:
        """Whether the check passed (no error recorded)."""
        return self.error is None


def run_contract_checks(kit: BackendKit, groups: tuple[str, ...] | None = None) -> list[CheckResult]:
    """Run every check (or those of ``groups``) on ``kit``; a failure is recorded, never raised."""
    results = []
    for check in CHECKS:
        if groups is not None and check.group not in groups:
            continue
        start = time.perf_counter()
        try:
            check(kit)
            error = None
        except ContractViolation as exc:
            error = str(exc)
        results.append(CheckResult(check, error, time.perf_counter() - start))
    return results

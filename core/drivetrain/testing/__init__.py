"""The driver conformance kit: run drivetrain's contract checks against any backend.

A backend author writes a :class:`BackendKit` (a tiny classifier, its optimizer, a
numpy-to-tensor function), names it in the DriverSpec (``testing_kit=``), and runs::

    from drivetrain.testing import ContractSuite

    class TestMyBackendContract(ContractSuite):
        backend = "mybackend"

or ``drivetrain backends --check mybackend``. Importing this module imports no
framework; the kit imports its own when it is built.
"""

from ._checks import CHECKS, GROUPS, Check, ContractViolation
from ._kit import (
    CLASSES,
    IN_FEATURES,
    ArrayDataset,
    BackendKit,
    classification_arrays,
    classifier_weights,
    kit_for,
    linear_classifier,
    torch_style_kit,
)
from ._suite import (
    CheckResult,
    ContractSuite,
    run_contract_checks,
)
from ._suite import (
    checked_waivers as checked_waivers,
)

__all__ = [
    "CHECKS",
    "CLASSES",
    "GROUPS",
    "IN_FEATURES",
    "ArrayDataset",
    "BackendKit",
    "Check",
    "CheckResult",
    "ContractSuite",
    "ContractViolation",
    "classification_arrays",
    "classifier_weights",
    "kit_for",
    "linear_classifier",
    "run_contract_checks",
    "torch_style_kit",
]

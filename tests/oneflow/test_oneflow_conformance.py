"""The oneflow backend through the public conformance kit (drivetrain.testing), on Python 3.10."""

import pytest

pytest.importorskip("oneflow")

from drivetrain.testing import ContractSuite  # noqa: E402


class TestOneflowContract(ContractSuite):
    backend = "oneflow"

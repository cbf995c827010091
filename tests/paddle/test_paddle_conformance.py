"""The paddle backend through the public conformance kit (drivetrain.testing)."""

from drivetrain.testing import ContractSuite


class TestPaddleContract(ContractSuite):
    backend = "paddle"

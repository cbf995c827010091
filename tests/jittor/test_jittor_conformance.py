"""The jittor backend through the public conformance kit (drivetrain.testing)."""

from drivetrain.testing import ContractSuite


class TestJittorContract(ContractSuite):
    backend = "jittor"

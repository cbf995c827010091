"""The numpy reference driver through the public conformance kit (drivetrain.testing)."""

from drivetrain.testing import ContractSuite


class TestNumpyContract(ContractSuite):
    backend = "numpy"

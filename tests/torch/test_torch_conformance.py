"""The torch backend through the public conformance kit (drivetrain.testing)."""

from drivetrain.testing import ContractSuite


class TestTorchContract(ContractSuite):
    backend = "torch"


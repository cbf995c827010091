"""drivetrain's conformance checks on this backend: the two lines every backend's test suite starts with."""

from drivetrain.testing import ContractSuite


class TestNumpyContract(ContractSuite):
    backend = "numpy"  # the kit is found through DriverSpec.testing_kit

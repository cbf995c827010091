"""The jax backend through the public conformance kit (drivetrain.testing): every check, none waived."""

from drivetrain.testing import ContractSuite


class TestJaxContract(ContractSuite):
    backend = "jax"

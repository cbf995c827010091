"""The torch backend through the public conformance kit (drivetrain.testing)."""

from drivetrain.testing import ContractSuite


class TestTorchContract(ContractSuite):
    backend = "torch"


class TestTorchFSDPContract(ContractSuite):
    """``driver="torch_fsdp"`` in one process (a world of one); its kit waives the two checks that checkpoint inside
    an accumulation cycle, which FSDP refuses. A model a Trainer sharded goes to an Evaluator as it is."""

    backend = "torch_fsdp"

"""Entry point: describes the numpy driver without building anything."""

from drivetrain import Capabilities, DriverSpec, hookimpl


@hookimpl
def drivetrain_driver_specs() -> list[DriverSpec]:
    return [
        DriverSpec(
            name="numpy",
            framework="numpy",
            factory="drivetrain_numpy.driver:create_driver",
            model_modules=("drivetrain_numpy",),
            capabilities=Capabilities(precisions=("fp32",), devices=("cpu",),
                                      notes={"purpose": "reference driver for tests; linear models only"}),
            distribution="drivetrain-numpy",
            contract_versions=(1,),  # what this release implements; never CONTRACT_VERSION (that follows the core)
            testing_kit="drivetrain_numpy.testing_kit:numpy_kit",
        )
    ]

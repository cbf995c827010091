"""Exception classes a user may want to catch; every message names the argument and the fix."""

from __future__ import annotations


class DrivetrainError(Exception):
    """Base class of every error drivetrain raises on purpose."""


class ConfigurationError(DrivetrainError, ValueError):
    """A Trainer/Evaluator argument is wrong; raised at construction, before any work."""


class DriverNotFoundError(DrivetrainError, ValueError):
    """The requested driver is unknown or its backend is not installed."""


class DriverError(DrivetrainError, ValueError):
    """A driver rejected an input (device, optimizer, precision, ...)."""


class BatchMismatchError(DrivetrainError, TypeError):
    """A batch does not fit the parameters of the function it is passed to."""


class DistributedError(DrivetrainError, RuntimeError):
    """A collective failed because another process failed, was killed or stopped answering;
    the message names that rank and what it reported."""


class PluginLoadError(DrivetrainError, ImportError):
    """A backend plugin failed to load while strict plugin loading is on."""


class EarlyStopException(DrivetrainError):
    """Raised by a callback to end training cleanly; the Trainer catches it."""


class Preempted(EarlyStopException):
    """Raised on every rank at the same step when the cluster asked the run to stop (Slurm's preemption or time
    limit signal, see ``PreemptionCallback``): training ends cleanly, its checkpoint resumes it exactly, and the
    run is not over (its records say ``preempted``)."""


class TrainingTerminated(SystemExit):
    """``Trainer.run()`` received SIGTERM (what SLURM, Kubernetes and ``kill`` send before killing).

    Raised in the main thread so that ``on_exception`` handlers run (a CheckpointCallback with
    ``save_on_exception=True`` writes its checkpoint) and ``on_train_end`` closes the records; then the
    process ends with status 143 (128 + SIGTERM), as a process killed by SIGTERM would. A
    ``SystemExit``, so an ``except Exception`` in user code does not swallow it.
    """

    def __init__(self, signum: int = 15) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        import signal

        return f"{signal.Signals(self.signum).name} received: the process was asked to end"

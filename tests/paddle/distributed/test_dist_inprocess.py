"""The distributed paddle driver without starting processes: choosing it, refusing bad input, re-sampling.

paddle's ``init_parallel_env`` does nothing for one process, so the collectives are
tested with real processes in ``test_dist_processes.py``; here, the layout and option
checks run as far as they can before a parallel environment would be needed.
"""

from __future__ import annotations

import types

import numpy as np
import paddle
import pytest

from drivetrain import DriverError, Trainer
from drivetrain._data.sampler import ReproducibleBatchSampler, UnrepeatedBatchSampler
from drivetrain.backend._plugins import available_drivers, create_driver
from drivetrain_paddle._dataloader import describe_sampling, reproducible_dataloader, unrepeated_dataloader
from drivetrain_paddle._launch import paddle_relaunch_command
from drivetrain_paddle.distributed import PaddleDataParallelDriver
from drivetrain_paddle.driver import PaddleSingleDriver

from ._dist_script import Net, Points

pytestmark = pytest.mark.paddle

ENDPOINTS = "127.0.0.1:6170,127.0.0.1:6171"


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch):
    for name in ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
                 "PADDLE_LOCAL_RANK", "PADDLE_LOCAL_SIZE", "PADDLE_RANK_IN_NODE", "PADDLE_MASTER", "MASTER_ADDR",
                 "MASTER_PORT", "DRIVETRAIN_SPAWN_STORE", "DRIVETRAIN_SPAWN_PARENT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def launched(monkeypatch):
    """This process looks like rank ``rank`` of 2 started by paddle's launcher (no process group is made)."""

    def as_rank(rank: int = 0, **extra: str) -> None:
        endpoints = ENDPOINTS.split(",")
        env = {"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ENDPOINTS": ENDPOINTS,
               "PADDLE_CURRENT_ENDPOINT": endpoints[rank], "PADDLE_LOCAL_RANK": str(rank), "PADDLE_LOCAL_SIZE": "2",
               **extra}
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return as_rank


def _driver(device="cpu", **options):
    paddle.seed(0)
    return create_driver("paddle", Net(), device, **options)


def _loader(n: int = 12, batch_size: int = 4, **options) -> paddle.io.DataLoader:
    return paddle.io.DataLoader(Points(n, seed=0), batch_size=batch_size, **options)


# ------------------------------------------------------------------ choosing the driver
def test_the_plugin_declares_distributed_support() -> None:
    caps = available_drivers()["paddle"].capabilities
    assert caps.distributed == ("ddp", "fleet")
    assert "gloo" in caps.notes["distributed"] and "paddle.distributed.launch" in caps.notes["distributed"]


def test_one_process_is_the_single_driver() -> None:
    assert type(_driver(nproc=1)) is PaddleSingleDriver
    assert type(_driver(["cpu"])) is PaddleSingleDriver


def test_under_the_launcher_the_distributed_driver_is_chosen(launched) -> None:
    launched(rank=1)
    driver = _driver()
    assert isinstance(driver, PaddleDataParallelDriver)
    assert driver.is_distributed() and driver.rank == 1 and driver.world_size == 2 and not driver.is_global_zero
    assert driver.plan.launch == "env" and driver.plan.backend == "gloo" and driver.plan.master == ("127.0.0.1", 6170)
    assert "rank 1/2" in driver.describe() and "DataParallel" in driver.describe()


def test_several_processes_cannot_be_started_from_pytest() -> None:
    with pytest.raises(DriverError, match="runs under pytest.*python -m paddle.distributed.launch --nproc_per_node N"):
        _driver(nproc=2)


@pytest.mark.parametrize(
    ("argv", "main_file", "fragment"),
    [
        (["-c"], None, "python -c"),
        (["-"], None, "python -c"),
        (["ipykernel_launcher.py"], None, "notebook"),
        (["/x/bin/pytest"], "/x/pytest/__main__.py", "pytest"),
    ],
)
def test_programs_that_cannot_be_run_again_are_refused(argv, main_file, fragment) -> None:
    main = types.SimpleNamespace(__file__=main_file) if main_file else types.SimpleNamespace()
    with pytest.raises(DriverError, match=fragment):
        paddle_relaunch_command(argv=argv, orig_argv=["python", *argv], main=main)


def test_a_script_is_run_again_with_the_same_interpreter_options() -> None:
    main = types.SimpleNamespace(__file__="/work/train.py")
    command = paddle_relaunch_command(argv=["train.py", "--lr", "1"],
                                      orig_argv=["python", "-X", "dev", "train.py", "--lr", "1"], main=main)
    assert command[1:] == ["-X", "dev", "train.py", "--lr", "1"]


# --------------------------------------------------------------------------- bad input
def test_nproc_must_match_the_launchers_world_size(launched) -> None:
    launched()
    with pytest.raises(DriverError, match=r"nproc=3 but this process belongs to a distributed run of 2 process\(es\) "
                                          r"\(PADDLE_TRAINERS_NUM=2\).*--nproc_per_node 3"):
        _driver(nproc=3)


def test_a_device_list_must_match_the_processes_on_this_machine(launched) -> None:
    launched()
    with pytest.raises(DriverError, match=r"device=\[0, 1, 2\] lists 3 device\(s\) but this machine runs 2 "
                                          r"process\(es\) \(PADDLE_LOCAL_SIZE\)"):
        _driver([0, 1, 2])


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"PADDLE_TRAINER_ID": "0"}, "PADDLE_TRAINER_ID='0' is set in the environment but PADDLE_TRAINERS_NUM is not"),
        ({"PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "2"}, "the id must be in 0..PADDLE_TRAINERS_NUM-1"),
        ({"PADDLE_TRAINER_ID": "x", "PADDLE_TRAINERS_NUM": "2"}, "PADDLE_TRAINER_ID='x' is not an integer"),
        ({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "2"}, "PADDLE_TRAINER_ENDPOINTS and PADDLE_CURRENT_ENDPOINT "
                                                                 "not set"),
        ({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_ENDPOINTS": ENDPOINTS,
          "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:6170"}, "lists 2 endpoint(s) but PADDLE_TRAINERS_NUM=3"),
    ],
)
def test_an_incomplete_launcher_environment_is_explained(monkeypatch, env, fragment) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DriverError) as info:
        _driver()
    assert fragment in str(info.value) and "python -m paddle.distributed.launch" in str(info.value)


def test_a_started_process_whose_store_folder_is_gone_says_so(launched, tmp_path) -> None:
    launched(1, DRIVETRAIN_SPAWN_STORE=str(tmp_path / "gone"))
    with pytest.raises(DriverError, match=r"DRIVETRAIN_SPAWN_STORE='.*gone' is not a folder\..*unset "
                                          r"DRIVETRAIN_SPAWN_STORE"):
        _driver()


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"timeout": 0}, "paddle_kwargs['timeout']=0 is not accepted; pass a number of seconds > 0"),
        ({"timeout": "30"}, "paddle_kwargs['timeout']='30' is not accepted"),
        ({"backend": "mpi"}, "paddle_kwargs['backend']='mpi' is not accepted; use one of ['gloo', 'nccl']"),
        ({"backend": "nccl"}, "the backend is 'nccl', which needs GPUs"),
        ({"fleet": "yes"}, "paddle_kwargs['fleet']='yes' must be True or False"),
        ({"overlap": 1}, "paddle_kwargs['overlap']=1 must be True or False"),
        ({"strategy": object()}, "is not a paddle.distributed.fleet.DistributedStrategy"),
        ({"spawn_output": "files"}, "paddle_kwargs['spawn_output']='files' is not accepted"),
        ({"to_static": True}, "paddle_kwargs['to_static']=True is not supported by the distributed paddle driver"),
    ],
)
def test_distributed_options_are_checked(launched, options, fragment) -> None:
    launched()
    with pytest.raises(DriverError) as info:
        _driver(framework_kwargs=options)
    assert fragment in str(info.value)


def test_a_fleet_strategy_needs_fleet_and_data_parallelism_only(launched) -> None:
    from paddle.distributed import fleet

    launched()
    with pytest.raises(DriverError, match="configures fleet; add 'fleet': True"):
        _driver(framework_kwargs={"strategy": fleet.DistributedStrategy()})
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2}
    with pytest.raises(DriverError, match=r"asks for \{'mp_degree': 2\}; drivetrain's paddle driver does data "
                                          r"parallelism only"):
        _driver(framework_kwargs={"fleet": True, "strategy": strategy})
    assert _driver(framework_kwargs={"fleet": True, "strategy": fleet.DistributedStrategy()}).plan.fleet


def test_gradients_overlap_backward_by_default_only_with_nccl(launched) -> None:
    """gloo: averaged after backward (a peer killed during paddle's reducer would abort this process unnamed)."""
    launched()
    assert not _driver().plan.overlap
    assert _driver(framework_kwargs={"overlap": True}).plan.overlap


def test_distributed_options_in_one_process_say_where_they_apply(model) -> None:
    optimizer = paddle.optimizer.SGD(parameters=model.parameters())
    for key, value in (("fleet", True), ("timeout", 5), ("find_unused_parameters", True)):
        with pytest.raises(DriverError, match=rf"paddle_kwargs\['{key}'\] applies to distributed paddle training, "
                                              "but this run is a single process"):
            Trainer(model, [{}], optimizer, driver="paddle", paddle_kwargs={key: value})


@pytest.mark.parametrize(
    ("device", "nproc", "fragment"),
    [
        (["cpu", "cpu"], None, "lists the CPU 2 times; to train with 2 CPU processes pass device='cpu', nproc=2"),
        (["gpu:0", "gpu:1"], None, "asks for a GPU but this paddle build has no CUDA"),
        ("gpu:0", 2, "asks for a GPU but this paddle build has no CUDA"),
        ([0, 1], 3, "nproc=3 but device=[0, 1] lists 2 devices"),
        ([], None, "device=[] is empty"),
        ("cpu", 0, "nproc=0 is not accepted"),
    ],
)
def test_bad_layouts_fail_before_any_process_starts(device, nproc, fragment) -> None:
    with pytest.raises(DriverError) as info:
        _driver(device, nproc=nproc)
    assert fragment in str(info.value)


def test_a_data_parallel_model_needs_the_parallel_environment() -> None:
    layer = Net()
    wrapped = paddle.DataParallel.__new__(paddle.DataParallel)  # what a user's wrapper looks like, without a group
    paddle.nn.Layer.__init__(wrapped)
    wrapped._layers = layer
    with pytest.raises(DriverError, match="model is a paddle.DataParallel but the parallel environment is not "
                                          "initialised"):
        create_driver("paddle", wrapped, "cpu")


# ------------------------------------------------------------------------- re-sampling
def test_training_shares_every_global_batch_between_the_ranks() -> None:
    np.random.seed(3)
    shares = [reproducible_dataloader(_loader(12, 2, shuffle=True), num_replicas=2, rank=r, agree_seed=lambda s: 7)
              for r in (0, 1)]
    for loader in shares:
        sampler = loader.batch_sampler
        assert isinstance(sampler, ReproducibleBatchSampler) and sampler.seed == 7 and sampler.num_replicas == 2
    batches = [[b["idx"].numpy().tolist() for b in loader] for loader in shares]
    assert len(batches[0]) == len(batches[1]) == 3
    assert sorted(sum(batches[0] + batches[1], [])) == list(range(12))


def test_evaluation_reads_each_sample_once_over_the_ranks() -> None:
    shards = [unrepeated_dataloader(_loader(7, 2), num_replicas=2, rank=r) for r in (0, 1)]
    assert all(isinstance(s.batch_sampler, UnrepeatedBatchSampler) for s in shards)
    seen = [i for shard in shards for b in shard for i in b["idx"].numpy().tolist()]
    assert sorted(seen) == list(range(7))


def test_a_loader_with_its_own_batch_sampler_is_refused_with_what_to_do(launched) -> None:
    launched()
    dataset = Points(12, seed=0)
    own = paddle.io.DataLoader(dataset, batch_sampler=paddle.io.DistributedBatchSampler(dataset, 4, num_replicas=2,
                                                                                         rank=0))
    assert "its own batch_sampler (DistributedBatchSampler)" in describe_sampling(own)
    driver = _driver()
    driver.check_dataloader_legality(own, "train_dataloader")
    with pytest.raises(DriverError, match=r"train_dataloader=DataLoader: distributed training gives each of the 2 "
                                          r"processes its share.*use_dist_sampler=False"):
        driver.set_dist_repro_dataloader(own, dist="train", reproducible=True)
    evaluate = paddle.io.DataLoader(dataset, batch_sampler=own.batch_sampler)
    with pytest.raises(DriverError, match=r"evaluate_dataloaders=DataLoader: evaluation gives each of the 2 "
                                          r"processes its own shard.*evaluate_use_dist_sampler=False"):
        driver.set_dist_repro_dataloader(evaluate, dist="eval", reproducible=False)

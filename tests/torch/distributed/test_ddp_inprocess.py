"""The distributed torch driver without starting processes: choosing it, refusing bad input, and its
parts on a one-process gloo group (collectives, dataloader sharding, a DDP model the user wrapped)."""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, WeightedRandomSampler

from drivetrain import Accuracy, DriverError, Trainer
from drivetrain._data.sampler import ReproducibleBatchSampler, find_reproducible_sampler
from drivetrain.backend._plugins import create_driver
from drivetrain_torch._dataloader import reproducible_dataloader, unrepeated_dataloader
from drivetrain_torch._launch import torch_relaunch_command as relaunch_command
from drivetrain_torch.distributed import DistributedError, TorchDDPDriver
from drivetrain_torch.driver import TorchSingleDriver

from ._ddp_script import Net, Points

pytestmark = pytest.mark.torch

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend this machine has ``n`` GPUs (only the layout checks run; nothing touches CUDA)."""

    def have(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return have


def _driver(device="cpu", **options):
    return create_driver("torch", Net(), device, **options)


def _loader(n: int = 12, batch_size: int = 4, **options) -> DataLoader:
    return DataLoader(Points(n, seed=0), batch_size=batch_size, **options)


# ------------------------------------------------------------------ choosing the driver
def test_nproc_one_is_a_single_process(model) -> None:
    assert isinstance(_driver(nproc=1), TorchSingleDriver)
    assert isinstance(_driver(["cpu"]), TorchSingleDriver)
    trainer = Trainer(model, [{"x": torch.randn(4, 4), "y": torch.tensor([0, 1, 0, 1])}],
                      torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", nproc=1, n_epochs=1,
                      progress_bar=None)
    trainer.run()
    assert not trainer.driver.is_distributed()


def test_several_processes_cannot_be_started_from_pytest() -> None:
    with pytest.raises(DriverError, match="runs under pytest.*torchrun --nproc_per_node N"):
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
def test_a_program_that_cannot_be_run_again_is_refused(argv, main_file, fragment) -> None:
    main = types.SimpleNamespace(__file__=main_file) if main_file else types.SimpleNamespace()
    with pytest.raises(DriverError, match=fragment) as info:
        relaunch_command(argv=argv, orig_argv=["python", *argv], main=main)
    assert "if __name__ == '__main__'" in str(info.value) and "torchrun" in str(info.value)


def test_a_script_is_run_again_with_the_same_interpreter_options() -> None:
    main = types.SimpleNamespace(__file__="/work/train.py")
    command = relaunch_command(argv=["train.py", "--lr", "1"], orig_argv=["python", "-X", "dev", "train.py", "--lr", "1"],
                               main=main)
    assert command == [sys.executable, "-X", "dev", "train.py", "--lr", "1"]
    module = relaunch_command(argv=["/work/pkg/train.py"], orig_argv=["python", "-m", "pkg.train"], main=main)
    assert module == [sys.executable, "-m", "pkg.train"]


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("device", "gpus", "fragment"),
    [
        ([0, 0], 2, r"lists cuda:0 more than once"),
        (["cpu", "cpu"], 0, r"lists the CPU 2 times.*device='cpu', nproc=2"),
        ([0, 5], 2, r"GPU\(s\) \[5\] do not exist; this process sees 2 CUDA device\(s\)"),
        ([0, 1], 0, r"asks for CUDA GPUs but torch.cuda.is_available\(\) is False"),
        (["cpu", 0], 1, "mixes CPU and GPUs"),
        ([0, -1], 2, "must be >= 0"),
        ([0, "cuda"], 2, "has no GPU index"),
        ([0, 1.5], 2, "is not a device"),
        ([], 0, r"device=\[\] is empty"),
    ],
)
def test_bad_device_lists_say_what_is_wrong(fake_gpus, device, gpus, fragment) -> None:
    fake_gpus(gpus)
    with pytest.raises(DriverError, match=fragment) as info:
        _driver(device)
    if device:
        assert f"device={device!r}" in str(info.value)


def test_more_processes_than_gpus_is_refused(fake_gpus) -> None:
    fake_gpus(1)
    with pytest.raises(DriverError, match=r"nproc=2 with device='cuda' needs 2 GPUs .* has 1 visible"):
        _driver("cuda", nproc=2)
    fake_gpus(2)
    with pytest.raises(DriverError, match=r"device='cuda:1' names one GPU but nproc=2.*device=\[0, 1\]"):
        _driver("cuda:1", nproc=2)
    with pytest.raises(DriverError, match=r"nproc=3 but device=\[0, 1\] lists 2 devices"):
        _driver([0, 1], nproc=3)


def test_nproc_must_match_torchruns_world_size(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(DriverError, match=r"nproc=3 but .* 2 process\(es\) \(WORLD_SIZE=2\).*--nproc_per_node 3"):
        _driver(nproc=3)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(DriverError, match=r"nproc=2 but .*WORLD_SIZE=1"):
        _driver(nproc=2)
    assert isinstance(_driver(), TorchSingleDriver)  # torchrun with one process: the single driver


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"RANK": "0"}, "RANK='0' is set in the environment but WORLD_SIZE is not"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK must be in 0..WORLD_SIZE-1"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT not set"),
    ],
)
def test_a_broken_launcher_environment_is_named(monkeypatch, env, fragment) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DriverError, match=fragment) as info:
        _driver()
    assert "torchrun" in str(info.value)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"timeout": -1}, r"torch_kwargs\['timeout'\]=-1 is not accepted"),
        ({"timeout": "60"}, r"torch_kwargs\['timeout'\]='60'"),
        ({"backend": "mpi"}, r"torch_kwargs\['backend'\]='mpi' is not accepted; use one of \['gloo', 'nccl'\]"),
        ({"backend": "nccl"}, "'nccl', which needs GPUs"),
        ({"ddp_kwargs": {"device_ids": [0]}}, r"\['device_ids'\] is set by drivetrain"),
        ({"ddp_kwargs": {"bucket_mb": 4}}, r"\['bucket_mb'\] is not a DistributedDataParallel option; accepted: .*bucket_cap_mb"),
        ({"ddp_kwargs": [1]}, "must be a dict"),
        ({"spawn_output": "files"}, r"spawn_output'\]='files' is not accepted"),
        ({"even_batches": "yes"}, r"even_batches'\]='yes' must be True or False"),
    ],
)
def test_bad_distributed_options_are_refused(options, fragment) -> None:
    with pytest.raises(DriverError, match=fragment):
        _driver(nproc=2, framework_kwargs=options)


def test_distributed_options_in_a_single_process_are_refused() -> None:
    with pytest.raises(DriverError, match=r"torch_kwargs\['timeout'\] applies to distributed .* nproc=N"):
        _driver(framework_kwargs={"timeout": 30})


# ------------------------------------------------------------------ sharding the data
def test_training_shards_are_halves_of_each_global_batch() -> None:
    loader = _loader(12, 2, shuffle=True)
    shards = [reproducible_dataloader(loader, num_replicas=2, rank=r, agree_seed=lambda s: 7) for r in (0, 1)]
    one = reproducible_dataloader(_loader(12, 4, shuffle=True), agree_seed=lambda s: 7)
    rank_batches = [[b["idx"].tolist() for b in s] for s in shards]
    for g, whole in enumerate(one):
        assert rank_batches[0][g] + rank_batches[1][g] == whole["idx"].tolist()
    assert find_reproducible_sampler(shards[1]).seed == 7


def test_evaluation_shards_cover_an_odd_set_once() -> None:
    for drop_last, expected in ((False, 37), (True, 36)):
        loader = _loader(37, 3, drop_last=drop_last)
        shards = [unrepeated_dataloader(loader, num_replicas=2, rank=r) for r in (0, 1)]
        seen = [i for s in shards for b in s for i in b["idx"].tolist()]
        assert sorted(seen) == list(range(expected))
        if not drop_last:
            assert [len(s) for s in shards] == [7, 6]  # uneven shards are fine for evaluation
    assert unrepeated_dataloader(_loader(sampler=WeightedRandomSampler([1.0] * 12, 12)), num_replicas=2,
                                 rank=0) is None


# --------------------------------------------------------- a one-process gloo group
@pytest.fixture
def group():
    """A real gloo process group of one process (no network), destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_an_existing_group_gets_the_ddp_driver(group) -> None:
    driver = _driver()
    driver.setup()
    assert isinstance(driver, TorchDDPDriver) and driver.plan.launch == "existing"
    assert driver.is_distributed() and driver.world_size == 1 and driver.rank == 0
    assert "TorchDDPDriver" in driver.describe() and "gloo" in driver.describe()
    with pytest.raises(DriverError, match=r"timeout'\] applies when drivetrain creates the process group"):
        _driver(framework_kwargs={"timeout": 5})
    with pytest.raises(DriverError, match=r"nproc=2 but .*1 process"):
        _driver(nproc=2)


def test_collectives(group) -> None:
    driver = _driver()
    driver.setup()
    for array in (np.arange(6, dtype=np.float64).reshape(2, 3), np.array([1, 5], dtype=np.int64),
                  np.array([True, False]), np.float32(2.5), np.array([3], dtype=np.uint16)):
        for op in ("sum", "max", "min"):
            reduced = driver.all_reduce(array, op)
            assert np.array_equal(reduced, np.asarray(array)) and reduced is not array
    with pytest.raises(DriverError, match="op='mean'"):
        driver.all_reduce(np.ones(2), "mean")
    with pytest.raises(DriverError, match="dtype object cannot be reduced"):
        driver.all_reduce(np.array([{}], dtype=object))
    assert driver.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
    assert driver.all_gather_object(("x", 3)) == [("x", 3)]
    driver.barrier()


def test_a_sampler_that_cannot_be_replaced_is_refused_with_the_fix(group) -> None:
    model = Net()
    custom = _loader(sampler=WeightedRandomSampler([1.0] * 12, 12))
    with pytest.raises(DriverError) as info:
        Trainer(model, custom, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", progress_bar=None)
    message = str(info.value)
    assert message.startswith("train_dataloader=DataLoader:") and "WeightedRandomSampler" in message
    assert "use_dist_sampler=False" in message and "shuffle=True/False" in message
    trainer = Trainer(model, custom, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch",
                      progress_bar=None, use_dist_sampler=False)
    assert trainer.dataloader is custom
    with pytest.raises(DriverError, match=r"evaluate_dataloaders\['dev'\]=DataLoader.*evaluate_use_dist_sampler=False"):
        Trainer(model, _loader(), torch.optim.SGD(model.parameters(), lr=0.1), driver="torch", progress_bar=None,
                evaluate_dataloaders={"dev": custom}, metrics={"acc": Accuracy()})
    with pytest.raises(DriverError, match=r"train_dataloader=list: .* not a torch DataLoader"):
        Trainer(model, [{"x": torch.ones(1, 4)}], torch.optim.SGD(model.parameters(), lr=0.1), driver="torch")


def test_even_batches_refuses_a_set_that_needs_padding(group) -> None:
    model = Net()
    options = {"driver": "torch", "progress_bar": None, "torch_kwargs": {"even_batches": True}}
    with pytest.raises(DriverError, match=r"torch_kwargs\['even_batches'\]=True: .*10 samples.*drop_last=True"):
        Trainer(model, _loader(10, 4), torch.optim.SGD(model.parameters(), lr=0.1), **options)
    trainer = Trainer(model, _loader(10, 4, drop_last=True), torch.optim.SGD(model.parameters(), lr=0.1), **options)
    assert isinstance(find_reproducible_sampler(trainer.dataloader), ReproducibleBatchSampler)


def test_training_and_evaluation_in_a_group_of_one(group) -> None:
    torch.manual_seed(0)
    model = Net()
    trainer = Trainer(model, _loader(16, 4, shuffle=True), torch.optim.SGD(model.parameters(), lr=0.1),
                      driver="torch", n_epochs=2, accumulation_steps=2, progress_bar=None,
                      evaluate_dataloaders=_loader(7, 3), metrics={"acc": Accuracy()})
    trainer.run(num_eval_sanity_batch=1)
    assert 0.0 <= trainer.evaluate()["acc#acc"] <= 1.0
    assert trainer.driver.unwrap_model() is model


def test_a_users_ddp_model_and_train_step(group, fake_gpus) -> None:
    """The user's own DDP is used as is; ``train_step`` runs inside its forward; forward is put back."""
    inner = Net()
    wrapped = torch.nn.parallel.DistributedDataParallel(inner)
    calls = []
    inner.train_step = lambda x, target: calls.append(1) or inner(x, target)
    trainer = Trainer(wrapped, _loader(8, 4), torch.optim.SGD(inner.parameters(), lr=0.1), driver="torch",
                      n_epochs=1, progress_bar=None)
    assert trainer.driver.unwrap_model() is inner and trainer.driver._ddp is wrapped
    trainer.run()
    assert len(calls) == 2 and "forward" not in inner.__dict__
    fake_gpus(1)
    with pytest.raises(DriverError, match=r"DistributedDataParallel on cpu but device=0 means cuda:0"):
        create_driver("torch", wrapped, 0)


def test_after_a_peer_failed_collectives_fail_at_once(group) -> None:
    driver = _driver()
    driver.setup()
    try:
        raise DistributedError("rank 1 was killed")
    except DistributedError:
        driver.on_exception()
    with pytest.raises(DistributedError, match="barrier.* not possible: the process group was shut down"):
        driver.barrier()
    assert dist.is_initialized()  # a group the user made is theirs to destroy


def test_every_rank_failing_keeps_the_group_for_a_last_checkpoint(group) -> None:
    driver = _driver()
    driver.setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            driver.on_exception()  # the only rank failed: all of them did
    driver.barrier()
    assert driver.all_gather_object(1) == [1]


def test_accumulation_exchanges_gradients_once_per_step(group) -> None:
    """With accumulation_steps=2, DDP's all-reduce runs on the second backward of each cycle only."""
    model = Net()
    trainer = Trainer(model, _loader(16, 4), torch.optim.SGD(model.parameters(), lr=0.1), driver="torch",
                      n_epochs=1, accumulation_steps=2, progress_bar=None)
    exchanges = []

    def counting(state, bucket):
        exchanges.append(trainer.global_forward_batches)
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    trainer.driver._ddp.register_comm_hook(None, counting)
    trainer.run()
    assert exchanges == [1, 3]  # batches 2 and 4 (0-based counters 1 and 3) close the cycles


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_through_ddp(group, precision) -> None:
    torch.manual_seed(0)
    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 on CPU warns that it is slow
        trainer = Trainer(model, _loader(8, 4), torch.optim.SGD(model.parameters(), lr=0.1), driver="torch",
                          n_epochs=1, precision=precision, progress_bar=None)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.run()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert (trainer.driver.grad_scaler is not None) == (precision == "fp16")

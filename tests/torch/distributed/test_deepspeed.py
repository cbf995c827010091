"""``driver="deepspeed"`` (DeepSpeed ZeRO) with real processes: torchrun with 2 ranks (gloo on CPU), one process
(a world of one), and the Trainer starting rank 1 itself; through the public API.

Three launches of ``_deepspeed_script.py`` (see its docstring) run every phase: one process
interrupted (a checkpoint at world size 1), then 2 ranks (DDP, ZeRO-2, ZeRO-3, interrupted and
resumed, resumed from the one-process checkpoint, an optimizer from a JSON config), then one
process again, resuming the 2-rank checkpoint. The tests compare them with DDP and with each
other. Contradictions between the config and the Trainer fail when the Trainer is built.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed deepspeed")
pytest.importorskip("drivetrain_deepspeed", reason="driver='deepspeed' needs pip install -e backends/deepspeed")

from drivetrain import DriverError, Trainer, export_weights  # noqa: E402

from ..._dist_helpers import free_port  # noqa: E402
from . import _deepspeed_script as script  # noqa: E402
from .conftest import ProcessGroup, max_diff, run_to_end, wait_for_file  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(200)]
SUITE_SECONDS = 148  # seconds: 118 alone, more beside other jobs (tests/conftest.py splits the process tests into shards by it)

TIMEOUT = 150  # one launch; the phases themselves take seconds
SCRIPT = str(Path(__file__).with_name("_deepspeed_script.py"))
TWO_RANK_PHASES = ("ddp,zero2,zero3,interrupt,resume-same,zero2-resume,ddp-interrupt,resume-other,ddp-resume-other,"
                   "config-optimizer,bf16,lean,lean-interrupt,lean-resume,fsdp-resume-lean,ddp-resume-lean,"
                   "fsdp-interrupt,lean-resume-fsdp,ddp-resume-fsdp,zero2-interrupt,zero2-resume-own,lean-resume-zero2,"
                   "ddp-resume-zero2,bf16-interrupt,bf16-resume,full,full-interrupt,full-resume,ddp-resume-full,fixed")
FP32 = 1e-6  # the same arithmetic, summed in another order


def _launch(cmd: list[str], out: Path) -> None:
    done = run_to_end(cmd, out, TIMEOUT)
    print(f"\n{' '.join(cmd[-3:])}: {done.seconds:.1f} s")


def _read(out: Path, phase: str, ranks: tuple[int, ...] = (0, 1)) -> dict[int, dict]:
    return {r: json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in ranks}


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> Path:
    """One process (a world of one): ZeRO-3 interrupted after ``INTERRUPT_AT`` batches, checkpoint in ./interrupted."""
    out = tmp_path_factory.mktemp("one")
    _launch([sys.executable, SCRIPT, str(out), "interrupt"], out)
    return out


@pytest.fixture(scope="module")
def run(one, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two")
    _launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
             str(free_port()), SCRIPT, str(out), TWO_RANK_PHASES, "--other", str(one / "interrupted")], out)
    return out


@pytest.fixture(scope="module")
def three(run, tmp_path_factory) -> Path:
    """3 ranks resuming the 2-rank ZeRO-3 checkpoint without persistent parameters: ZeRO-3, ZeRO-2 and DDP."""
    out = tmp_path_factory.mktemp("three")
    _launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", "--master_port",
             str(free_port()), SCRIPT, str(out), "lean-resume-other,zero2-resume-other,ddp-resume-other", "--other",
             str(run / "lean-interrupted")], out)
    return out


@pytest.fixture(scope="module")
def back(run, tmp_path_factory) -> Path:
    """One process resuming the 2-rank ZeRO-3 checkpoint (and DDP's of the same point), then two refusals."""
    out = tmp_path_factory.mktemp("back")
    _launch([sys.executable, SCRIPT, str(out), "ddp-resume-other,resume-other,bad-batch,bad-accumulation,fixed,"
             "fixed-resume-other",
             "--other", str(run / "interrupted")], out)
    return out


# ------------------------------------------------------------------------ training
def test_the_deepspeed_launcher_starts_the_same_run_as_torchrun(run, tmp_path) -> None:
    """DeepSpeed's own launcher (``deepspeed --num_gpus 2``; on the CPU accelerator it starts 2 processes) sets
    the variables torchrun sets: the ZeRO-2 run is the torchrun one, bit for bit."""
    launcher = Path(sys.executable).with_name("deepspeed")
    _launch([str(launcher), "--num_gpus", "2", "--master_port", str(free_port()), SCRIPT, str(tmp_path), "zero2"],
            tmp_path)
    launched, reference = _read(tmp_path, "zero2"), _read(run, "zero2")
    for rank in (0, 1):
        assert launched[rank]["world_size"] == 2 and launched[rank]["rank"] == rank
        assert launched[rank]["params"] == reference[rank]["params"]


@pytest.mark.parametrize("phase", ["zero2", "zero3", "config-optimizer"])
def test_zero_training_equals_ddp(run, phase) -> None:
    """2 epochs, accumulation 2, clipping by norm, AdamW: the parameters of DDP within fp32 rounding."""
    ddp = _read(run, "ddp")[0]["params"]
    for rank, result in _read(run, phase).items():
        assert result["driver"] == "TorchDeepSpeedDriver" and result["rank"] == rank and result["world_size"] == 2
        assert f"zero_stage={3 if phase == 'zero3' else 2}" in result["describe"]
        assert max_diff(result["params"], ddp) < FP32


@pytest.mark.parametrize("phase", ["zero2", "zero3"])
def test_the_logged_gradient_norm_is_the_global_one(run, phase) -> None:
    expected = [row["train/grad_norm"] for row in _read(run, "ddp")[0]["history"]["train"]]
    assert max(expected) > script.GRAD_CLIP  # clipping did act
    for result in _read(run, phase).values():
        assert [row["train/grad_norm"] for row in result["history"]["train"]] == pytest.approx(expected, rel=1e-5)


def test_a_process_group_the_user_started_is_used_and_left_alone(run, tmp_path) -> None:
    """``init_process_group`` before the Trainer: the same ZeRO-3 run as when the driver starts the group."""
    _launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
             str(free_port()), SCRIPT, str(tmp_path), "existing-group"], tmp_path)
    for rank, result in _read(tmp_path, "existing-group").items():
        assert result["rank"] == rank and result["world_size"] == 2
        assert max_diff(result["params"], _read(run, "zero3")[rank]["params"]) == 0.0


def test_bf16_trains_with_fp32_master_weights(run) -> None:
    bf16, fp32 = _read(run, "bf16"), _read(run, "zero3")[0]["params"]
    assert bf16[0]["params"] == bf16[1]["params"]
    assert 0 < max_diff(bf16[0]["params"], fp32) < 0.1  # bf16 arithmetic: close, not equal
    assert "precision=bf16" in bf16[0]["describe"]


def test_a_bf16_run_resumes_bit_exact(run) -> None:
    """The checkpoint holds the fp32 master weights; the bf16 copy the forward uses is cut from them again."""
    full, resumed = _read(run, "bf16"), _read(run, "bf16-resume")
    for rank in (0, 1):
        assert max_diff(resumed[rank]["params"], full[rank]["params"]) == 0.0


def test_loaded_weights_are_the_ones_the_forward_uses(run) -> None:
    """ZeRO-3 keeps small parameters whole on every rank (below stage3_param_persistence_threshold): loading must
    reach them too, not only the partitions."""
    for result in _read(run, "zero3").values():
        assert result["loaded_forward_diff"] == 0.0


def test_evaluation_and_prediction_on_an_odd_set(run) -> None:
    """37 samples: one rank evaluates a batch more than the other; ZeRO-3 gathered its parameters, nothing waits."""
    zero2, zero3 = _read(run, "zero2"), _read(run, "zero3")
    for result in [*zero2.values(), *zero3.values()]:
        assert result["eval"] == pytest.approx(zero2[0]["eval"], abs=1e-12)
        assert len(result["predict"]["pred"]) == 37
    assert zero3[0]["predict"] == zero3[1]["predict"]


# ---------------------------------------------------------------------- checkpoints
def test_resume_at_the_same_world_size_is_bit_exact(run) -> None:
    full, resumed = _read(run, "zero3"), _read(run, "resume-same")
    for rank in (0, 1):
        assert max_diff(resumed[rank]["params"], full[rank]["params"]) == 0.0


def test_a_zero3_checkpoint_resumes_under_zero2(run) -> None:
    assert max_diff(_read(run, "zero2-resume")[0]["params"], _read(run, "zero3")[0]["params"]) < FP32


def test_one_process_to_two_ranks(run, one) -> None:
    """The world-of-one checkpoint resumed by 2 ZeRO-3 ranks equals DDP resuming it; every sample seen once."""
    resumed, ddp = _read(run, "resume-other"), _read(run, "ddp-resume-other")
    assert max_diff(resumed[0]["params"], ddp[0]["params"]) < FP32
    before = _read(one, "interrupt", (0,))[0]
    assert before["world_size"] == 1
    seen = before["seen"]["0"] + resumed[0]["seen"]["0"] + resumed[1]["seen"]["0"]
    assert sorted(seen) == list(range(script.N_TRAIN))


def test_two_ranks_to_one_process(back) -> None:
    """The 2-rank ZeRO-3 checkpoint resumed by ZeRO-3 in one process equals driver='torch' resuming it."""
    resumed, plain = _read(back, "resume-other", (0,))[0], _read(back, "ddp-resume-other", (0,))[0]
    assert resumed["world_size"] == 1 and plain["driver"] == "TorchSingleDriver"
    assert max_diff(resumed["params"], plain["params"]) < FP32


def test_the_checkpoint_is_the_torch_drivers_and_loads_into_driver_torch(run) -> None:
    folder = run / "interrupted"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["driver"] == "torch" and manifest["pickle"] is False
    assert all(name.endswith((".json", ".safetensors")) for name in os.listdir(folder))
    interrupted = _read(run, "interrupt")[0]["params"]
    assert max_diff(interrupted, _read(run, "ddp-interrupt")[0]["params"]) < FP32
    model = script.Net()
    loader = torch.utils.data.DataLoader(script.Points(8, seed=0), batch_size=4)
    trainer = Trainer(model, loader, torch.optim.AdamW(model.parameters(), lr=0.01), driver="torch", progress_bar=None)
    trainer.load_checkpoint(str(folder), resume_training=False)
    assert script.state_lists(model.state_dict()) == interrupted


def test_export_and_save_model_write_the_full_weights(run, tmp_path) -> None:
    from safetensors.torch import load_file

    target = tmp_path / "merged.safetensors"
    done = subprocess.run([sys.executable, "-m", "drivetrain", "export", str(run / "interrupted"), "-o", str(target)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert script.state_lists(load_file(str(target))) == _read(run, "interrupt")[0]["params"]
    model = export_weights(run / "model", tmp_path / "model.safetensors")  # save_model under ZeRO-3 writes shards
    assert script.state_lists(load_file(model)) == _read(run, "zero3")[0]["params"]


def test_a_full_state_dict_checkpoint_is_one_file_and_resumes_bit_exact(run) -> None:
    """``state_dict="full"``: every rank gathers, rank 0 writes the torch drivers' one-file format (weights and AdamW
    state); resumed under ZeRO-3 it continues bit for bit, and driver='torch' resumes it too."""
    folder = run / "full-interrupted"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "sharded" not in manifest and manifest["driver"] == "torch"
    assert not any(name.startswith("shards") for name in os.listdir(folder))
    assert _read(run, "full-interrupt")[0]["params"] == _read(run, "interrupt")[0]["params"]
    whole, resumed = _read(run, "full"), _read(run, "full-resume")
    for rank in (0, 1):
        assert max_diff(resumed[rank]["params"], whole[rank]["params"]) == 0.0
    assert max_diff(whole[0]["params"], _read(run, "zero3")[0]["params"]) == 0.0
    assert max_diff(_read(run, "ddp-resume-full")[0]["params"], whole[0]["params"]) < FP32


# ---------------------------------------------------------------- sharded (ZeRO-3)
def test_zero3_checkpoints_are_written_by_every_rank(run) -> None:
    """Each rank wrote its own partitions (no gather): two shard files, each holding part of every weight."""
    from safetensors import safe_open

    for name in ("interrupted", "lean-interrupted", "model"):
        manifest = json.loads((run / name / "manifest.json").read_text())
        assert manifest["sharded"]["world_size"] == 2 and manifest["driver"] == "torch"
        assert "model.safetensors" not in manifest["files"]
        keys = set(json.loads((run / name / "shards.json").read_text())["tensors"])
        has_optimizer = any(key.startswith("optimizers/") for key in keys)
        assert has_optimizer == (name != "model")  # save_model writes the weights only
    for rank in (0, 1):
        with safe_open(str(run / "lean-interrupted" / f"shards-0000{rank}-of-00002.safetensors"), "pt") as f:
            stored = sum(f.get_slice(key).get_shape()[0] for key in f.keys() if key.startswith("model/head.weight"))
            assert 0 < stored < 3  # head.weight is 3x16: 24 values a rank, so a row and a half, in boxes


def test_zero3_resume_without_persistent_parameters_is_bit_exact(run) -> None:
    full, resumed = _read(run, "lean"), _read(run, "lean-resume")
    for rank in (0, 1):
        assert max_diff(resumed[rank]["params"], full[rank]["params"]) == 0.0
    assert max_diff(full[0]["params"], _read(run, "zero3")[0]["params"]) < FP32


@pytest.mark.parametrize("phase", ["lean-resume-other", "zero2-resume-other"])
def test_zero_partitions_reshard_to_three_ranks(three, phase) -> None:
    """3 ranks cut every tensor at other places than 2 did (ZeRO-3: each parameter in three; ZeRO-2: each parameter
    group's flat buffer in three, across parameter boundaries): equal to DDP resuming it."""
    resumed, ddp = _read(three, phase, (0, 1, 2)), _read(three, "ddp-resume-other", (0, 1, 2))
    assert resumed[0]["world_size"] == 3
    assert resumed[0]["params"] == resumed[1]["params"] == resumed[2]["params"]
    assert max_diff(resumed[0]["params"], ddp[0]["params"]) < FP32


def test_zero2_writes_sharded_checkpoints_and_resumes_them(run) -> None:
    """ZeRO-2 owns a range of each parameter group's flat fp32 buffer: each rank writes those, nothing gathered."""
    manifest = json.loads((run / "zero2-interrupted" / "manifest.json").read_text())
    assert manifest["sharded"]["world_size"] == 2
    full, resumed = _read(run, "zero2"), _read(run, "zero2-resume-own")
    for rank in (0, 1):
        assert max_diff(resumed[rank]["params"], full[rank]["params"]) == 0.0
    ddp = _read(run, "ddp-resume-zero2")[0]["params"]
    assert max_diff(_read(run, "lean-resume-zero2")[0]["params"], ddp) < FP32


def test_a_hugging_face_gpt2_trained_under_zero3_exports_to_from_pretrained(tmp_path) -> None:
    """Tied input/output embeddings partitioned by ZeRO-3 and written by both ranks under both names: the export
    is what ``GPT2LMHeadModel.from_pretrained`` reads, equal to the trained weights."""
    transformers = pytest.importorskip("transformers")
    _launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
             str(free_port()), SCRIPT, str(tmp_path), "gpt2"], tmp_path)
    trained = _read(tmp_path, "gpt2")[0]["params"]
    assert "lm_head.weight" in trained and "transformer.wte.weight" in trained
    folder = tmp_path / "hf"
    folder.mkdir()
    transformers.GPT2Config(**script.GPT2_SETTINGS).save_pretrained(folder)
    export_weights(tmp_path / "gpt2-model", folder)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    loaded = script.state_lists(transformers.GPT2LMHeadModel.from_pretrained(folder).state_dict())
    assert {name: loaded[name] for name in trained} == trained


def test_zero3_and_fsdp_resume_each_others_checkpoints(run) -> None:
    assert max_diff(_read(run, "fsdp-resume-lean")[0]["params"], _read(run, "ddp-resume-lean")[0]["params"]) < FP32
    assert _read(run, "fsdp-resume-lean")[0]["driver"] == "TorchFSDPDriver"
    assert max_diff(_read(run, "lean-resume-fsdp")[0]["params"], _read(run, "ddp-resume-fsdp")[0]["params"]) < FP32
    assert max_diff(_read(run, "ddp-resume-lean")[0]["params"], _read(run, "lean")[0]["params"]) < FP32


# ------------------------------------------------------------------------- failures
def test_a_killed_rank_ends_the_job_naming_it(tmp_path) -> None:
    group = ProcessGroup([sys.executable, SCRIPT, str(tmp_path), "kill", "--nproc", "2"], tmp_path)
    try:
        wait_for_file(tmp_path / "pid-rank1", timeout=90)  # written (whole) while rank 1 waits in batch 3
        os.kill(int((tmp_path / "pid-rank1").read_text()), signal.SIGKILL)
        done = group.wait(60)
    finally:
        group.close()
    assert done.returncode != 0
    assert "because rank 1 was killed by SIGKILL" in done.output, done.output[-3000:]


def test_evaluation_and_prediction_take_any_batch_size_when_the_config_fixes_trainings(run, back) -> None:
    """The config's train_micro_batch_size_per_gpu binds the train dataloader alone: evaluation (batch 3) and
    prediction (batch 5) work beside a train batch of 4, on 2 ranks and on one process, fresh and resuming the
    2-rank checkpoint; training is the same as with the micro-batch left to the dataloader."""
    for out, phase, same_as, ranks in ((run, "fixed", "zero3", (0, 1)), (back, "fixed", None, (0,)),
                                       (back, "fixed-resume-other", "resume-other", (0,))):
        results = _read(out, phase, ranks)
        for rank, result in results.items():
            assert result["world_size"] == len(ranks)
            assert len(result["history"]) > 0 and 0.0 <= result["eval"]["acc#acc"] <= 1.0
            assert all(len(values) == script.N_EVAL for values in result["predict"].values()), result["predict"].keys()
            if same_as is not None:
                assert max_diff(result["params"], _read(out, same_as, ranks)[rank]["params"]) == 0.0


def test_contradictions_found_at_run_time_are_refused_naming_both(back) -> None:
    batch = _read(back, "bad-batch", (0,))[0]["refused"]
    assert "train_dataloader's batch_size=4" in batch and "deepspeed_kwargs['config']" in batch and "16" in batch
    accumulation = _read(back, "bad-accumulation", (0,))[0]["refused"]
    assert "['gradient_accumulation_steps']=4" in accumulation and "accumulation_steps=2" in accumulation


def _build(optimizer: bool = True, **options) -> Trainer:
    model = script.Net()
    loader = torch.utils.data.DataLoader(script.Points(8, seed=0), batch_size=4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01) if optimizer else None
    return Trainer(model, loader, opt, driver="deepspeed", progress_bar=None, **options)


@pytest.mark.parametrize(("options", "words"), [
    ({"deepspeed_kwargs": {"config": 3}}, ["deepspeed_kwargs['config'] is a int", "dict"]),
    ({"deepspeed_kwargs": {"config": "/nonexistent/ds.json"}}, ["'/nonexistent/ds.json' cannot be read"]),
    ({"deepspeed_kwargs": {"zero_stage": 4}}, ["deepspeed_kwargs['zero_stage']=4", "1, 2 or 3"]),
    ({"deepspeed_kwargs": {"zero_stage": 2, "config": {"zero_optimization": {"stage": 3}}}},
     ["zero_stage']=2 contradicts", "['stage']=3"]),
    ({"precision": "bf16", "deepspeed_kwargs": {"config": {"fp16": {"enabled": True}}}},
     ["Trainer(precision='bf16') contradicts", "['fp16']['enabled']=True", "precision='fp16'"]),
    ({"deepspeed_kwargs": {"config": {"bf16": {"enabled": True}}}},
     ["Trainer(precision='fp32') contradicts", "pass precision='bf16'"]),
    ({"grad_clip": 1.0, "deepspeed_kwargs": {"config": {"gradient_clipping": 0.5}}},
     ["Trainer(grad_clip=1.0) contradicts", "['gradient_clipping']=0.5"]),
    ({"grad_clip": 1.0, "grad_clip_type": "value"}, ["grad_clip_type='value'", "norm"]),
    ({"deepspeed_kwargs": {"config": {"optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}}},
     ["['optimizer']", "optimizers=None"]),
    ({"deepspeed_kwargs": {"config": {"managed_gradient_accumulation": True}}},
     ["managed_gradient_accumulation", "remove it"]),
    ({"deepspeed_kwargs": {"ddp_kwargs": {}}}, ["ddp_kwargs", "deepspeed_kwargs['config']"]),
    ({"accumulation_steps": 2, "deepspeed_kwargs": {"config": {"gradient_accumulation_steps": 4}}},
     ["['gradient_accumulation_steps']=4 contradicts Trainer(accumulation_steps=2)", "accumulation_steps=4"]),
    ({"precision": "fp16"}, ["precision='fp16'", "does not support", "bf16"]),
], ids=["config-type", "config-path", "stage", "stage-twice", "precision", "precision-default", "clipping",
        "clip-by-value", "two-optimizers", "managed-accumulation", "ddp-kwargs", "accumulation", "fp16-on-cpu"])
def test_a_bad_option_names_the_argument_and_the_fix(options, words) -> None:
    """Refused before any process group starts (the checks run when the Trainer is built)."""
    import torch.distributed as dist

    if options.get("precision") == "fp16":
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().is_fp16_supported():
            pytest.skip("this accelerator supports fp16")
    with pytest.raises(DriverError) as caught:
        _build(**options)
    for word in words:
        assert word in str(caught.value)
    assert not dist.is_initialized()


def test_the_driver_is_registered_with_its_install_command() -> None:
    """Where deepspeed is missing, choosing the driver says what to install (the core's message for the spec)."""
    from drivetrain.backend._plugins import available_drivers

    spec = available_drivers()["deepspeed"]
    assert spec.framework == "deepspeed" and spec.factory == "drivetrain_deepspeed.factory:create_driver"
    assert spec.distribution == "drivetrain-deepspeed"
    # the framework's own command first (the package is installed when this is read), then the checkout's
    assert spec.install_command.startswith('pip install "deepspeed>=')
    assert "-e backends/torch -e backends/deepspeed" in spec.install_command
    assert spec.capabilities.distributed == ("zero",) and not spec.claims(torch.nn.Linear(1, 1))

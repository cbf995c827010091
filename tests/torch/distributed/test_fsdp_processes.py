"""``driver="torch_fsdp"`` (FSDP2) with real processes: torchrun, 2 ranks, gloo on CPU, through the public API.

One torchrun launch runs every phase of ``_fsdp_script.py`` (see its docstring); the tests
compare them with one process training on the global batch (``driver="torch"``), with DDP,
and with each other across checkpoints: FSDP -> FSDP at 2 ranks, FSDP -> one process,
one process -> FSDP, DDP -> FSDP and FSDP -> DDP. Bad options fail when the Trainer is built.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

from drivetrain import DriverError, Trainer

from ..._dist_helpers import free_port
from . import _fsdp_script as script
from .conftest import ProcessGroup, max_diff, run_to_end

pytestmark = [pytest.mark.distributed, pytest.mark.torch, pytest.mark.timeout(180)]
SUITE_SECONDS = 22  # seconds, measured alone (tests/conftest.py splits the process tests into shards by it)

TIMEOUT = 150  # the whole launch; the phases themselves take seconds
SCRIPT = str(Path(__file__).with_name("_fsdp_script.py"))


def _read(out: Path, phase: str, world: int = 2) -> dict[int, dict]:
    return {r: json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in range(world)}


def _launch(out: Path, phases: str, nproc: int = 2, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), SCRIPT, str(out), phases, *extra]
    done = run_to_end(cmd, out, TIMEOUT)
    print(f"\ntorchrun, {nproc} ranks, {phases}: {done.seconds:.1f} s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One process, global batch (2 x 4): what FSDP must reproduce; and a one-process run interrupted after
    ``INTERRUPT_AT`` batches of 4, for two FSDP ranks to resume."""
    out = tmp_path_factory.mktemp("reference")
    torch.manual_seed(0)
    model = script.Net()
    trainer = script.build_trainer(model, batch_size=2 * script.BATCH_PER_RANK, driver="torch", callbacks=[],
                                   evaluate=True)
    trainer.run(num_eval_sanity_batch=0)
    evaluated = trainer.evaluate()
    torch.manual_seed(0)
    recorder = script.Recorder()
    folder = out / "one-process"
    script.build_trainer(script.Net(), batch_size=script.BATCH_PER_RANK, driver="torch",
                         callbacks=[recorder, script.StopAt(script.INTERRUPT_AT, str(folder))]).run()
    return {"params": script.state_lists(model.state_dict()), "history": trainer.history, "eval": evaluated,
            "folder": folder, "seen": recorder.seen}


@pytest.fixture(scope="module")
def run(reference, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    phases = ("full,interrupt,resume-same,resume-one,ddp-interrupt,resume-from-ddp,ddp-from-fsdp,options,fp16,"
              "mid-cycle,full-state,save-fails,meta")
    _launch(out, phases, 2, "--one-process", str(reference["folder"]))
    return out


@pytest.fixture(scope="module")
def resharded(run, tmp_path_factory) -> dict[int, Path]:
    """The 2-rank sharded checkpoint ``interrupted`` loaded at 3 ranks (and saved there as ``from-3``), which
    is loaded at 2 ranks again: ``{world size: output folder}``."""
    three, two = tmp_path_factory.mktemp("three"), tmp_path_factory.mktemp("two")
    _launch(three, "reshard", 3, "--source", str(run / "interrupted"))
    _launch(two, "reshard", 2, "--source", str(three / "from-3"))
    return {3: three, 2: two}


# ------------------------------------------------------------------------ training
def test_fsdp_matches_one_process_with_the_global_batch(run, reference) -> None:
    full = _read(run, "full")
    for rank, result in full.items():
        assert result["driver"] == "TorchFSDPDriver" and result["rank"] == rank and result["world_size"] == 2
        assert max_diff(result["params"], reference["params"]) < 1e-6  # accumulation 2, AdamW, clipping


def test_clipping_logs_the_global_norm_of_the_sharded_gradients(run, reference) -> None:
    expected = [row["train/grad_norm"] for row in reference["history"]["train"]]
    assert max(expected) > script.GRAD_CLIP  # clipping did act
    for result in _read(run, "full").values():
        assert [row["train/grad_norm"] for row in result["history"]["train"]] == pytest.approx(expected, rel=1e-5)


def test_evaluation_and_prediction_on_an_odd_set_equal_one_process(run, reference) -> None:
    """37 samples: one rank evaluates a batch more than the other, and nothing waits for it."""
    full = _read(run, "full")
    for result in full.values():
        assert result["eval"] == pytest.approx(reference["eval"], abs=1e-12)
        assert len(result["predict"]["pred"]) == script.N_EVAL
    assert full[0]["predict"] == full[1]["predict"]  # every rank gets the whole set back


def test_bf16_blocks_and_activation_checkpointing_train(run) -> None:
    options = _read(run, "options")
    assert options[0]["params"] == options[1]["params"]
    full = _read(run, "full")[0]["params"]
    assert 0 < max_diff(options[0]["params"], full) < 0.2  # bf16 arithmetic, no accumulation: close, not equal


def test_fp16_skips_a_step_on_every_rank_when_one_shard_overflows(run) -> None:
    """The inf sits in rank 0's shard only; the scaler's verdict is all-reduced (DTensor's unscale), so both
    ranks skip the first step and halve the scale, then step together."""
    fp16 = _read(run, "fp16")
    for result in fp16.values():
        assert result["scales"] == [32768.0, 32768.0]
        assert result["after_first"] == result["initial"]  # the first step was skipped
    assert fp16[0]["params"] == fp16[1]["params"] != fp16[0]["initial"]  # the second was taken, alike


# ---------------------------------------------------------------------- checkpoints
def test_resume_at_two_ranks_is_bit_exact(run) -> None:
    full, resumed = _read(run, "full"), _read(run, "resume-same")
    for rank in (0, 1):
        assert max_diff(resumed[rank]["params"], full[rank]["params"]) == 0.0


def test_ddp_and_fsdp_checkpoints_load_into_each_other(run) -> None:
    full = _read(run, "full")[0]["params"]
    assert _read(run, "ddp-interrupt")[0]["params"] == _read(run, "interrupt")[0]["params"]
    for phase, driver in (("resume-from-ddp", "TorchFSDPDriver"), ("ddp-from-fsdp", "TorchDDPDriver")):
        result = _read(run, phase)[0]
        assert result["driver"] == driver
        assert max_diff(result["params"], full) < 1e-6


def test_a_one_process_checkpoint_resumes_on_two_fsdp_ranks(run, reference) -> None:
    before = reference["seen"]["0"]
    after = _read(run, "resume-one")
    assert sorted(before + after[0]["seen"]["0"] + after[1]["seen"]["0"]) == list(range(script.N_TRAIN))


def test_an_fsdp_checkpoint_loads_in_one_process(run) -> None:
    """2 -> 1 with driver='torch': the weights are the interrupted run's, and resuming equals resuming the
    DDP checkpoint of the same point."""
    interrupted = _read(run, "interrupt")[0]["params"]
    finals = []
    for folder in ("interrupted", "ddp-interrupted"):
        torch.manual_seed(0)
        model = script.Net()
        trainer = script.build_trainer(model, batch_size=script.BATCH_PER_RANK, driver="torch", callbacks=[])
        trainer.load_checkpoint(str(run / folder), resume_training=False)
        assert script.state_lists(model.state_dict()) == interrupted
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a cycle boundary: no gradients to drop
            trainer.run(resume_from=str(run / folder))
        finals.append(script.state_lists(model.state_dict()))
    assert finals[0] == finals[1]


def test_a_checkpoint_inside_an_accumulation_cycle_is_refused_with_the_fix(run) -> None:
    for result in _read(run, "mid-cycle").values():
        assert "inside a gradient-accumulation cycle" in result["refused"]
        assert "multiple of accumulation_steps" in result["refused"]
    assert not (run / "mid-cycle").exists()


def test_the_trainer_starts_the_other_fsdp_process_itself(run, tmp_path) -> None:
    """``python _fsdp_script.py ... --nproc 2``: the same run as under torchrun."""
    group = ProcessGroup([sys.executable, SCRIPT, str(tmp_path), "options", "--nproc", "2"], tmp_path)
    try:
        done = group.wait(TIMEOUT)
    finally:
        group.close()
    assert done.returncode == 0, done.output
    spawned, launched = _read(tmp_path, "options"), _read(run, "options")
    for rank in (0, 1):
        assert spawned[rank]["params"] == launched[rank]["params"]


def test_save_model_writes_shards_that_export_merges_into_the_full_weights(run, tmp_path) -> None:
    from safetensors.torch import load_file

    from drivetrain import export_weights

    folder = run / "model"
    assert sorted(p.name for p in folder.glob("shards-*")) == ["shards-00000-of-00002.safetensors",
                                                              "shards-00001-of-00002.safetensors"]
    assert not (folder / "model.safetensors").exists()  # nothing was gathered
    stored = json.loads((folder / "shards.json").read_text())["tensors"]
    assert stored and all(key.startswith("model/") for key in stored)  # the weights only, no optimizer state
    weights = load_file(export_weights(folder, tmp_path / "merged.safetensors"))
    assert script.state_lists(weights) == _read(run, "full")[0]["params"]
    model = script.Net()
    model.load_state_dict(weights)  # a plain load_state_dict reads the merged file


# ----------------------------------------------------------------- sharded checkpoints
def test_each_rank_writes_its_own_shards_and_the_manifest_covers_them(run) -> None:
    folder = run / "interrupted"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["sharded"]["world_size"] == 2
    shards = sorted(p.name for p in folder.glob("shards-*"))
    assert shards == manifest["sharded"]["files"] and set(shards) <= set(manifest["files"])
    assert "model.safetensors" not in manifest["files"]
    layout = json.loads((folder / "shards.json").read_text())["tensors"]
    chunks = layout["model/blocks.0.fc.weight"]["chunks"]
    assert [(c["file"], c["offsets"], c["sizes"]) for c in chunks] == [
        (shards[0], [0, 0], [8, 16]), (shards[1], [8, 0], [8, 16])]  # rows split between the ranks


def test_a_sharded_checkpoint_reshards_from_two_ranks_to_three_and_back(run, resharded) -> None:
    """Weights and AdamW moments loaded at 3 ranks (uneven 16-row shards: 6, 6, 4) equal the 2-rank state
    at the interrupt bit for bit; saved at 3 ranks and loaded at 2, again."""
    interrupted = _read(run, "interrupt")[0]
    assert json.loads((resharded[3] / "from-3" / "manifest.json").read_text())["sharded"]["world_size"] == 3
    for world, out in resharded.items():
        for result in _read(out, "reshard", world).values():
            assert result["world_size"] == world
            assert result["params"] == interrupted["params"]
            assert result["optim"] == interrupted["optim"]


def test_a_three_rank_checkpoint_loads_in_one_process(run, resharded) -> None:
    interrupted = _read(run, "interrupt")[0]
    model = script.Net()
    trainer = script.build_trainer(model, batch_size=script.BATCH_PER_RANK, driver="torch", callbacks=[])
    trainer.load_checkpoint(str(resharded[3] / "from-3"), resume_training=False)
    assert script.state_lists(model.state_dict()) == interrupted["params"]
    assert json.loads(json.dumps(script.optimizer_lists(trainer.driver.optimizer_states()))) == interrupted["optim"]


def test_a_damaged_shard_is_refused_before_anything_loads(run, tmp_path) -> None:
    import shutil

    from drivetrain import CheckpointError

    copy = tmp_path / "damaged"
    shutil.copytree(run / "interrupted", copy)
    shard = copy / "shards-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    torch.manual_seed(0)
    model = script.Net()
    before = script.state_lists(model.state_dict())
    trainer = script.build_trainer(model, batch_size=script.BATCH_PER_RANK, driver="torch", callbacks=[])
    with pytest.raises(CheckpointError, match=r"shards-00001-of-00002.safetensors is damaged: its sha256"):
        trainer.load_checkpoint(str(copy))
    assert script.state_lists(model.state_dict()) == before


def test_a_rank_failing_to_write_its_shard_leaves_the_previous_checkpoint(run) -> None:
    for result in _read(run, "save-fails").values():
        assert "rank 1 failed (OSError" in result["error"] and "No space left" in result["error"]
        assert "previous checkpoint under this name, if any, is unchanged" in result["error"]
        assert result["unchanged"] and result["leftovers"] == []


def test_a_meta_device_model_is_created_shard_by_shard_and_loads_weights_by_slice(run, reference) -> None:
    """Built on the meta device, each rank initialises only its rows (drawn per rank: no repeated rows), then
    load_model reads each rank's slices of a plain file; training from there equals the normal FSDP run."""
    full = _read(run, "full")[0]["params"]
    for result in _read(run, "meta").values():
        weight = result["initialised"]["blocks.0.fc.weight"]
        rows = [weight[i * 16:(i + 1) * 16] for i in range(16)]
        assert rows[:8] != rows[8:]  # rank 0's shard and rank 1's were drawn from different streams
        assert result["params"] == full


def test_state_dict_full_gathers_to_rank_zero_in_one_file(run) -> None:
    folder = run / "interrupted-full"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "model.safetensors" in manifest["files"] and "sharded" not in manifest
    assert _read(run, "full-state")[0]["params"] == _read(run, "interrupt")[0]["params"]
    model = script.Net()
    trainer = script.build_trainer(model, batch_size=script.BATCH_PER_RANK, driver="torch", callbacks=[])
    trainer.load_checkpoint(str(folder), resume_training=False)
    assert script.state_lists(model.state_dict()) == _read(run, "interrupt")[0]["params"]


# --------------------------------------------------------------------- bad options
def _build(**options) -> Trainer:
    model = script.Net()
    loader = torch.utils.data.DataLoader(script.Points(8, seed=0), batch_size=4)
    return Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), driver="torch_fsdp",
                   progress_bar=None, **options)


@pytest.mark.parametrize(("options", "words"), [
    ({"nproc": 2, "torch_fsdp_kwargs": {"wrap": ["Nope"]}},
     ["torch_fsdp_kwargs['wrap']", "'Nope'", "'Block'"]),
    ({"nproc": 2, "torch_fsdp_kwargs": {"wrap": 3}}, ["torch_fsdp_kwargs['wrap']=3", "class names"]),
    ({"nproc": 2, "torch_fsdp_kwargs": {"mixed_precision": "int8"}},
     ["torch_fsdp_kwargs['mixed_precision']='int8'", "'bf16'"]),
    ({"nproc": 2, "torch_fsdp_kwargs": {"cpu_offload": True}}, ["torch_fsdp_kwargs['cpu_offload']", "GPU"]),
    ({"nproc": 2, "torch_fsdp_kwargs": {"ddp_kwargs": {}}}, ["ddp_kwargs", "torch_fsdp_kwargs"]),
    ({"nproc": 2, "torch_fsdp_kwargs": {"activation_checkpointing": "yes"}},
     ["torch_fsdp_kwargs['activation_checkpointing']"]),
    ({"nproc": 2, "torch_fsdp_kwargs": {"state_dict": "gathered"}},
     ["torch_fsdp_kwargs['state_dict']='gathered'", "'sharded'", "'full'"]),
], ids=["wrap-absent", "wrap-type", "mixed-precision", "cpu-offload-on-cpu", "ddp-kwargs",
        "not-a-bool", "state-dict"])
def test_a_bad_option_names_the_argument_and_the_fix(options, words) -> None:
    with pytest.raises(DriverError) as caught:
        _build(**options)
    for word in words:
        assert word in str(caught.value)

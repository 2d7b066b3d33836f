"""TrainState is everything a restart needs: to_checkpoint / from_checkpoint round trip exactly."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import attncnn
from attncnn.runs import load_checkpoint, resolve_config, write_checkpoint
from attncnn.training import TrainingError
from attncnn.training.components import make_loaders
from attncnn.training.distributed import Distributed
from attncnn.training.rng import capture_rng, rank_seed, restore_rng
from attncnn.training.state import TrainState


@pytest.fixture(scope="module")
def setup(make_tiny_data):
    config = resolve_config("demo", data=str(make_tiny_data(20, 6)), epochs=2, batch_size=10,
                            model={"dim": 16, "mlp_dim": 16})
    dist = Distributed()
    dataset, train_loader, _ = make_loaders(config, dist)
    return config, dataset, train_loader, dist


def _steps(state: TrainState, loader, n: int) -> None:
    for step, (x, y) in loader.batches(state.epoch, start=state.step):
        if step == n:
            break
        state.schedule.set_lr(state.optimizer, state.epoch, step)
        logits = state.model(x)
        loss = F.cross_entropy(logits, y)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.add_step(loss.detach(), logits.detach(), y)


def test_a_mid_epoch_checkpoint_restores_every_field(setup, tmp_path):
    config, dataset, loader, dist = setup
    state = TrainState.start(config, dataset, loader, dist)
    _steps(state, loader, 3)
    state.best, state.record = {"accuracy": 0.25, "epoch": 1}, {"epoch": 1, "test_accuracy": 0.25}
    state.epoch = 1
    path = tmp_path / "last.safetensors"
    write_checkpoint(path, state.to_checkpoint())
    rng_at_save = torch.get_rng_state()
    torch.manual_seed(123)                                       # anything drawn since must be undone

    other = TrainState.start(config, dataset, loader, dist)
    other.from_checkpoint(load_checkpoint(path), path)
    assert (other.epoch, other.step, other.best, other.record) == (1, 3, state.best, state.record)
    assert torch.equal(other.sums.loss_sum, state.sums.loss_sum) and other.sums.count == state.sums.count == 30
    assert torch.equal(other.sums.correct, state.sums.correct)
    for name, tensor in state.model.state_dict().items():
        assert torch.equal(other.model.state_dict()[name], tensor), name
    momentum = [s["momentum_buffer"] for s in other.optimizer.state.values()]
    assert len(momentum) == len(list(state.model.parameters()))
    assert torch.equal(torch.get_rng_state(), rng_at_save)


def test_a_checkpoint_at_an_epoch_end_has_no_running_sums(setup, tmp_path):
    config, dataset, loader, dist = setup
    state = TrainState.start(config, dataset, loader, dist)
    ckpt = state.to_checkpoint()
    assert "train_loss_sum" not in ckpt.extra_tensors and "train_count" not in ckpt.metadata
    assert set(ckpt.extra_tensors) == {"rng.rank0.torch_cpu"}                  # one key scheme for every rank
    meta = ckpt.metadata
    assert (meta["epoch"], meta["step_in_epoch"], meta["arch"]) == (0, 0, "image-transformer")


def test_a_position_outside_the_run_is_refused(setup, tmp_path):
    config, dataset, loader, dist = setup
    state = TrainState.start(config, dataset, loader, dist)
    ckpt = state.to_checkpoint()
    ckpt.metadata["step_in_epoch"] = len(loader) + 1
    with pytest.raises(TrainingError, match=r"does not fit this run \(2 epochs of 6 steps\)"):
        TrainState.start(config, dataset, loader, dist).from_checkpoint(ckpt, tmp_path / "x")


def test_end_epoch_keeps_the_best_accuracy(setup):
    config, dataset, loader, dist = setup
    state = TrainState.start(config, dataset, loader, dist)
    assert state.end_epoch({"test_accuracy": 0.5}) and state.best == {"accuracy": 0.5, "epoch": 1}
    assert not state.end_epoch({"test_accuracy": 0.5}) and state.best["epoch"] == 1    # ties keep the first
    assert state.end_epoch({"test_accuracy": 0.6}) and state.best == {"accuracy": 0.6, "epoch": 3}
    assert (state.epoch, state.step, state.sums.count) == (3, 0, 0)


def test_rng_round_trip_and_a_missing_rank_starts_a_known_stream(caplog):
    dist = Distributed()
    torch.manual_seed(5)
    saved = capture_rng(dist)
    expected = torch.rand(3)
    restore_rng(dist, saved, seed=42, epoch=0, step=0)
    assert torch.equal(torch.rand(3), expected)
    with caplog.at_level(logging.WARNING):
        restore_rng(dist, {}, seed=42, epoch=1, step=2)
    assert "no random-generator state for rank 0" in caplog.text
    drawn = torch.rand(3)
    torch.manual_seed(rank_seed(42, 0, 1, 2))
    assert torch.equal(drawn, torch.rand(3))


def test_a_checkpoint_records_the_training_image_size_which_the_loaded_model_requires(setup, tmp_path):
    config, dataset, loader, dist = setup
    path = tmp_path / "last.safetensors"
    write_checkpoint(path, TrainState.start(config, dataset, loader, dist).to_checkpoint())
    assert load_checkpoint(path).metadata["image_size"] == list(dataset.train.images.shape[-2:]) == [32, 32]
    model = attncnn.load_model(path)
    assert "CIFAR" not in dataset.source and model.image_size == (32, 32)       # from the record, not the data's name
    with pytest.raises(ValueError, match=r"was trained on 32x32 images \(height x width\), got 24x32; .*Resize them "
                                         r"to 32x32 first, or pass resize=True"):
        model(torch.rand(2, 3, 24, 32))
    assert model(torch.rand(2, 3, 24, 32), resize=True).shape == (2, 3)

"""The run-time choices a plan leaves open, made once on the run's real objects: :func:`choose_on`.

The loop calls :func:`choose_on` after it has built the model, the optimizer and the loaders (and
loaded a resumed run's checkpoint) and before the first step. Where the plan has a chooser
(:attr:`~attncnn.training.RunPlan.choose`, from :mod:`attncnn.perf`), it is given those objects
(:class:`~attncnn.training.RunParts`, without the loaders), and its answer is applied to the
network (:func:`use_paths`) and to the plan, which ``machine.json`` then records. The chooser must
leave the objects' state as it found them.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from ..layers import attention_modules
from .plan import Choices, RunParts, RunPlan

__all__ = ["choose_on", "use_paths"]


def use_paths(model: nn.Module, impl: str | None, eval_impl: str | None) -> None:
    """Put every attention layer of ``model`` on the training path ``impl`` and the test-pass path
    ``eval_impl`` (None: ``impl`` in both modes), and its ``config`` with them; ``impl`` None changes
    nothing.

    Raises:
        InputError: a path the layers do not have (the layer's message).
    """
    if impl is None:
        return
    for layer in attention_modules(model):
        layer.impl, layer.eval_impl = impl, eval_impl
    config = getattr(model, "config", None)
    if dataclasses.is_dataclass(config) and {"impl", "eval_impl"} <= {f.name for f in dataclasses.fields(config)}:
        model.config = dataclasses.replace(config, impl=impl, eval_impl=eval_impl)


def choose_on(plan: RunPlan, state, dataset, train_loader, test_loader) -> RunPlan:
    """``plan`` with what it leaves open decided on the run's real objects (``state``; the loaders'
    lengths and batch sizes are read), the network put on the decided paths; ``plan.decided()``
    where it has no chooser."""
    if plan.choose is None:
        return plan.decided()
    config, schedule = state.config, state.schedule
    steps = max(config.epochs * schedule.steps_per_epoch - (state.epoch * schedule.steps_per_epoch + state.step), 0)
    test_images = len(dataset.test.labels)
    eval_batch = max(min(test_loader.batch_size, test_images), 1)
    passes = _test_passes(config.epochs, config.eval_every, state.epoch)
    parts = RunParts(model=state.model, optimizer=state.optimizer, config=config, device=state.dist.device,
                     precision=plan.precision, batch=train_loader.batch_size,
                     image_shape=tuple(dataset.train.images.shape[1:]), num_classes=dataset.num_classes,
                     steps=steps, eval_batch=eval_batch, test_batches=len(test_loader), test_passes=passes,
                     distributed=state.dist.enabled)
    choices = plan.choose(parts) or Choices()
    decided = plan.decided(choices)
    if choices.impl is not None:
        use_paths(state.model, decided.impl, decided.eval_impl)
    return decided


def _test_passes(epochs: int, every: int, done: int) -> int:
    """Test passes of epochs ``done + 1 .. epochs``: every ``every``-th, and the last one
    (:func:`~attncnn.training.loop.evaluates`)."""
    if done >= epochs:
        return 0
    return epochs // every - done // every + (1 if epochs % every else 0)

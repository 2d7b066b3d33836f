"""Shared by the tests that evaluate shipped runs: how far ``attncnn evaluate`` may land from the
accuracy a run recorded while it trained, and the check of a shipped run's final weights
(:func:`check_shipped_run`).

A run with a prediction record (``predictions.json``: what ``attncnn evaluate`` of its shipped
weights predicted for each test image, recorded once; their full evaluations took about 8 of the
suite's 15 minutes on two cores, a paper-width one over a minute, and content attention at width
400 would take about seven) is checked in two parts: the record gives the run's accuracy, and the
weights evaluated now on a fixed class-balanced sample of the test images predict what the record
says, image by image, within the flips rounding makes (:data:`SAMPLE_FLIPS`). A run without one is
evaluated on the whole test set. A run shipped without its weights (``weights-withheld.json``) is
checked by its record alone: the record's accuracy, counted against this data set's labels, is the
run's, and the withheld file's record names the epoch and precision the report gives.
"""

from __future__ import annotations

import json

import pytest

from attncnn.cli import main
from attncnn.data import load_dataset
from attncnn.runs import PREDICTIONS_FILE, disagreements, read_predictions, read_withheld
from attncnn.runs.checkpoint import read_metadata
from attncnn.runs.loading import checkpoint_of

#: at the precision the run trained at: bf16 kernels of another CPU or GPU round differently (and
#: paper-long's weights were rounded to bfloat16 for shipping): 10 of the 10,000 test images
SAME_PRECISION = 1e-3
#: fp32 for a bf16-trained run, what ``evaluate`` picks on a CPU without bf16 units: measured up to
#: 12 of the 10,000 images (efficiency-geometry/dilated-conv/10pct/seed0: 51.25 % against 51.13 %)
OTHER_PRECISION = 3e-3


@pytest.fixture(scope="session")
def accuracy_tolerance():
    """``accuracy_tolerance(path, evaluated)``: the allowed |accuracy difference| (a fraction) for
    ``evaluated``, the JSON of ``attncnn evaluate path --json``, against the run's recorded accuracy."""
    def tolerance(path, evaluated: dict) -> float:
        trained = read_metadata(checkpoint_of(path)).get("config", {}).get("precision", "fp32")
        return SAME_PRECISION if evaluated["precision"] == trained else OTHER_PRECISION

    return tolerance


#: test images a run with a prediction record is evaluated on (``attncnn evaluate --sample``): a few
#: hundred tell the record's weights from others as surely as 1,000 did (below), at under a third of
#: the time (a width-400 model's 1,000 took 30-40 s on 2 cores)
SAMPLE = 300
#: disagreements with the record allowed on the sample. Rounding flips a few images in a thousand:
#: learned-mini evaluated in bf16 and in fp32 on one Xeon disagree on 14 of the 10,000 test images,
#: 0.42 expected in 300 (5 or more: about 1 in 13,000 evaluations); other weights, a broken load or a wrong
#: attention path disagree on about one image in ten (the three seeds of mini-long's quadratic-mini,
#: pairwise: 103-119 of 1,000), about 30 of 300 (4 or fewer: about 1 in 10^9)
SAMPLE_FLIPS = 4


@pytest.fixture(scope="session")
def check_shipped_run(cifar10_path, accuracy_tolerance, tmp_path_factory):
    """``check_shipped_run(folder, accuracy)``: the run's final weights (``checkpoints/last``) give
    ``accuracy``, the one it recorded while training, within :func:`accuracy_tolerance` (see the
    module's description for a run with a prediction record)."""
    def check(folder, accuracy: float) -> None:
        last = folder / "checkpoints" / "last.safetensors"
        withheld = read_withheld(folder)
        if withheld is not None and not last.exists():
            check_withheld(folder, withheld, accuracy)
            return
        made = tmp_path_factory.mktemp("evaluated") / PREDICTIONS_FILE
        if not (folder / PREDICTIONS_FILE).is_file():
            assert main(["evaluate", str(last), "--data", str(cifar10_path), "--predictions", str(made)]) == 0
            evaluated = read_predictions(made)          # in fp32 where bf16 is slow: minutes, not ten
            tolerance = accuracy_tolerance(last, {"precision": evaluated.precision})
            assert evaluated.test_accuracy == pytest.approx(accuracy, abs=tolerance)
            return
        record = read_predictions(folder / PREDICTIONS_FILE)
        data = load_dataset(str(cifar10_path))
        # the record: every test image of this data set, by the final weights; its accuracy the run's
        assert (record.indices, record.checkpoint, record.dataset) == (None, last.name, data.shareable_name)
        correct = sum(p == y for p, y in zip(record.predictions, data.test.labels.tolist()))
        assert len(record.predictions) == len(data.test) and record.test_accuracy == correct / len(data.test)
        tolerance = accuracy_tolerance(last, {"precision": record.precision})
        assert record.test_accuracy == pytest.approx(accuracy, abs=tolerance)
        # the weights now, on a sample, image by image
        assert main(["evaluate", str(last), "--data", str(cifar10_path), "--sample", str(SAMPLE),
                     "--predictions", str(made)]) == 0
        now = read_predictions(made)
        assert len(now.predictions) == SAMPLE
        assert disagreements(now.predictions, record.for_images(now.indices)) <= SAMPLE_FLIPS

    def check_withheld(folder, withheld: dict, accuracy: float) -> None:
        record = read_predictions(folder / PREDICTIONS_FILE)
        data = load_dataset(str(cifar10_path))
        meta = withheld["metadata"]
        # the record was made from the withheld file: the whole split of this data set, its epoch
        assert (record.indices, record.checkpoint, record.dataset) == (None, last_name(withheld), data.shareable_name)
        assert record.epoch == meta["epoch"] == json.loads((folder / "finished.json").read_text())["epochs"]
        correct = sum(p == y for p, y in zip(record.predictions, data.test.labels.tolist()))
        assert len(record.predictions) == len(data.test) and record.test_accuracy == correct / len(data.test)
        tolerance = SAME_PRECISION if record.precision == meta["config"]["precision"] else OTHER_PRECISION
        assert record.test_accuracy == pytest.approx(accuracy, abs=tolerance)
        assert withheld["bytes"] > 0 and len(withheld["sha256"]) == 64 and "attncnn reproduce" in withheld["retrain"]

    return check


def last_name(withheld: dict) -> str:
    """The file name a withheld run's weights had (``last.safetensors``)."""
    return withheld["file"].rsplit("/", 1)[-1]

"""NumPy arrays torch cannot convert (object, text) are refused in one line that names the dtype and
the conversion, not with torch's TypeError. A small random-weight model: no committed results needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attncnn
from attncnn.errors import InputError


def _model() -> attncnn.Classifier:
    torch.manual_seed(0)
    return attncnn.Classifier(attncnn.build_model("demo", num_classes=10, image_size=32), image_size=32).eval()


def _object_array() -> np.ndarray:
    images = np.empty(2, dtype=object)              # a list of images kept as an array of arrays
    images[0], images[1] = (np.random.default_rng(0).random((3, 32, 32), dtype=np.float32) for _ in range(2))
    return images


@pytest.mark.parametrize("images", [_object_array(), np.full((1, 3, 32, 32), "0.5"),
                                    np.zeros((1, 3, 32, 32), dtype=object)], ids=["arrays", "text", "object"])
def test_an_array_torch_cannot_convert_is_refused_naming_its_dtype_and_the_fix(images):
    model = _model()
    for call in (model.predict, model, model.preprocess):
        with pytest.raises(InputError, match=rf"got a NumPy array of dtype {images.dtype}; convert it first: "
                                             r"np.asarray\(images, dtype=np.float32\)"):
            call(images)


def test_float_and_uint8_arrays_still_work_and_agree():
    model = _model()
    floats = np.random.default_rng(1).random((2, 3, 32, 32)).astype(np.float32)
    assert len(model.predict(floats)) == 2
    stacked = np.stack(list(_object_array()))                    # the conversion the message names
    assert model.predict(stacked) == model.predict(torch.as_tensor(stacked))

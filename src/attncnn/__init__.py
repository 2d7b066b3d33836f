"""attncnn: self-attention as convolution, after Cordonnier, Loukas & Jaggi (ICLR 2020).

From Python, three lines give a trained model's attention maps::

    import attncnn
    model = attncnn.pretrained("learned-mini")          # a Classifier: model(images in [0, 1]) -> logits
    maps = attncnn.attention_maps(model)                # per layer: probs (1, 9, 256, 256)

Public entry points: :func:`pretrained`, :func:`download`, :func:`load_model`, :func:`attention_maps`,
:func:`locality`, :func:`attention_rollout` (:mod:`attncnn.api`); :func:`build_model`, :func:`list_presets`,
:func:`count_parameters` (:mod:`attncnn.models`). Every error a user can fix is an
:class:`AttncnnError` (:mod:`attncnn.errors`).
"""

from .api import (Classifier, LayerAttention, attention_maps, attention_rollout, download, list_pretrained, load_model,
                  locality, pretrained)
from .errors import AttncnnError
from .models import build_model, count_parameters, list_presets

__version__ = "0.1.0"
__all__ = ["pretrained", "download", "load_model", "attention_maps", "locality", "attention_rollout", "list_pretrained",
           "Classifier", "LayerAttention", "build_model", "list_presets", "count_parameters", "AttncnnError",
           "__version__"]

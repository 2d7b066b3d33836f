"""The way in from Python: trained models in one line, ready for images in ``[0, 1]``, and their
attention maps; re-exported at the top level (``attncnn.pretrained``, ...).

* :func:`pretrained`: a model this project trained, by name;
* :func:`download`: fetch a width-400 model into the user cache, each file checked by sha256;
* :func:`load_model`: a model from any run folder or checkpoint;
* :class:`Classifier`: what both return, the network with its input normalisation and class names;
* :func:`attention_maps`: per-layer probabilities and score terms from real activations;
* :func:`locality`: each head's mean attention distance and normalised entropy;
  :func:`attention_rollout`: attention rollout through the layers.

No other package of attncnn imports this one (the top-level ``attncnn`` re-exports it).
"""

from .attention import LayerAttention, attention_maps
from .classifier import Classifier, load_model
from .locality import attention_rollout, locality
from .downloads import DownloadError, download, downloadable, downloads_folder
from .pretrained import (PACKAGED_MODELS, RESULTS_ENV, list_pretrained, model_folders, pretrained, pretrained_path,
                         results_folders)

__all__ = ["Classifier", "load_model", "pretrained", "pretrained_path", "list_pretrained", "results_folders",
           "model_folders", "RESULTS_ENV", "PACKAGED_MODELS", "download", "downloadable", "downloads_folder",
           "DownloadError", "LayerAttention", "attention_maps", "locality", "attention_rollout"]

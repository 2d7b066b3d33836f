"""attncnn: self-attention as convolution, after Cordonnier, Loukas & Jaggi (ICLR 2020).

Public entry points: :func:`build_model`, :func:`list_presets`; layers in :mod:`attncnn.layers`,
networks in :mod:`attncnn.models`, data in :mod:`attncnn.data`, training in :mod:`attncnn.training`.
"""

from .models import build_model, count_parameters, list_presets

__version__ = "0.1.0"
__all__ = ["build_model", "list_presets", "count_parameters", "__version__"]

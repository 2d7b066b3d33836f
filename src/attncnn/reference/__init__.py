"""Checkpoints of the reference code (epfml/attention-cnn at 9ffaa30) in and out.

:func:`convert_reference` turns a reference ``*.checkpoint`` (and its ``config.yaml``) into an
attncnn run folder; :func:`export_reference` writes an attncnn network as a reference checkpoint
and ``config.yaml``. All five of the reference's attention kinds are covered
(:data:`REFERENCE_KINDS`); the tensor names: :mod:`attncnn.reference.weights`; the
hyperparameters: :mod:`attncnn.reference.recipe`. Nothing in attncnn below the command line
imports this package.
"""

from .config import REFERENCE_DEFAULTS, infer_from_tensors, read_reference_config, resolve_reference_config
from .convert import PROVENANCE_FILE, convert_reference, export_reference, read_reference_checkpoint, reference_kinds
from .kinds import REFERENCE_KINDS, ReferenceKind

__all__ = ["convert_reference", "export_reference", "read_reference_checkpoint", "read_reference_config",
           "resolve_reference_config", "infer_from_tensors", "reference_kinds", "REFERENCE_KINDS", "ReferenceKind",
           "REFERENCE_DEFAULTS", "PROVENANCE_FILE"]

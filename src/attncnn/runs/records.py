"""The lines of a run's ``metrics.jsonl`` as records, and a summary made strict JSON."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["record_of", "epoch_of", "finite"]


def record_of(line: str) -> dict | None:
    """The JSON object on ``line``, or None where it holds none (a line cut short)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def epoch_of(record: dict) -> int | None:
    """A record's integer ``"epoch"``, or None."""
    epoch = record.get("epoch")
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def finite(obj: Any) -> Any:
    """Replace NaN/inf floats by None so the summary is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj

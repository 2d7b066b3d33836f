"""``attncnn presets``: the presets with their exact parameter counts."""

from __future__ import annotations

import argparse
import json

__all__ = ["register", "handle"]


def register(sub) -> None:
    p = sub.add_parser("presets", help="list presets with exact parameter counts")
    p.add_argument("--json", action="store_true", help="print JSON (with each preset's model options and recipe)")

    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..models import build_model, count_parameters, get_preset, list_presets

    rows = []
    for name in list_presets():
        preset = get_preset(name)
        rows.append({"name": name, "parameters": count_parameters(build_model(name)), "arch": preset.arch,
                     "description": preset.description, "paper_accuracy": preset.paper.get("accuracy"),
                     "paper_parameters": preset.paper.get("params"), "model": preset.model,
                     "recipe": preset.train})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len("preset"), *(len(r["name"]) for r in rows))
    print(f"{'preset':<{width}} {'parameters':>12}  {'paper acc.':>10}  description")
    for r in rows:
        acc = "-" if r["paper_accuracy"] is None else f"{r['paper_accuracy']:.3f}"
        print(f"{r['name']:<{width}} {r['parameters']:>12,}  {acc:>10}  {r['description']}")
    return 0

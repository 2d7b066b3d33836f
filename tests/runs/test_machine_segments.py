"""``machine.json``'s segments: one per process run, completed by the process that ran it, and a
segment its process never completed (killed, power cut) closed as ``"crashed"`` by the next one."""

from __future__ import annotations

import json

from attncnn.runs.machine_file import MACHINE_FILE, end_segment, last_segment, start_segment

MACHINE = {"date": "2025-01-01", "cpu": "AMD EPYC", "cores": 2, "torch_threads": 2, "torch": "2.13.0", "device": "cpu"}
SHORT = {"cpu": "AMD EPYC", "threads": 2, "torch": "2.13.0", "device": "cpu"}


def _segment(epoch: int, step: int = 0) -> dict:
    """A segment as the loop starts it: from ``epoch`` epochs done, ``step`` steps into the next."""
    return {"epochs": [epoch + 1, epoch], "start": {"epoch": epoch, "step": step}, "device": "cpu",
            "precision": "fp32", "compiled": False, "deterministic": True}


def _segments(folder) -> list[dict]:
    return json.loads((folder / MACHINE_FILE).read_text())["segments"]


def test_a_segment_left_running_is_closed_as_crashed_at_the_epochs_its_checkpoint_kept(tmp_path):
    start_segment(tmp_path, _segment(0), MACHINE)
    end_segment(tmp_path, 2, "interrupted")
    start_segment(tmp_path, _segment(2), MACHINE)       # then killed: trained epochs 3-5, its checkpoint kept 4
    assert last_segment(tmp_path)["ended"] == "running"
    start_segment(tmp_path, _segment(4, step=7), MACHINE)
    segments = _segments(tmp_path)
    assert [(s["epochs"], s["ended"]) for s in segments] == [
        ([1, 2], "interrupted"), ([3, 4], "crashed"), ([5, 4], "running")]
    assert segments[1] == {**_segment(2), "epochs": [3, 4], "machine": SHORT, "ended": "crashed"}
    end_segment(tmp_path, 6, "finished")
    assert [(s["epochs"], s["ended"]) for s in _segments(tmp_path)] == [
        ([1, 2], "interrupted"), ([3, 4], "crashed"), ([5, 6], "finished")]


def test_a_segment_killed_before_its_first_checkpoint_finished_no_epoch(tmp_path):
    start_segment(tmp_path, _segment(3), MACHINE)       # killed mid-epoch 4, before any checkpoint
    start_segment(tmp_path, _segment(3, step=0), MACHINE)
    assert [(s["epochs"], s["ended"]) for s in _segments(tmp_path)] == [([4, 3], "crashed"), ([4, 3], "running")]
    # a checkpoint older than the killed segment (its own pruned, or deleted by hand) keeps none of its epochs
    folder = tmp_path / "older"
    folder.mkdir()
    start_segment(folder, _segment(5), MACHINE)
    start_segment(folder, _segment(2), MACHINE)
    assert _segments(folder)[0]["epochs"] == [6, 5]


def test_a_completed_segment_is_left_as_it_ended(tmp_path):
    start_segment(tmp_path, _segment(0), MACHINE)
    end_segment(tmp_path, 1, "failed")
    start_segment(tmp_path, _segment(1), MACHINE)
    assert [(s["epochs"], s["ended"]) for s in _segments(tmp_path)] == [([1, 1], "failed"), ([2, 1], "running")]

"""A run's checkpoint whose metadata changed on disk is refused by the commands that read it."""

import json

from attncnn.cli import main


def test_evaluate_and_resume_refuse_a_checkpoint_whose_metadata_changed(make_tiny_data, tmp_path, capsys):
    data = make_tiny_data(4, 2)
    run = tmp_path / "run"
    common = ["--data", str(data), "--data-dir", str(tmp_path / "cache")]
    assert main(["train", "--preset", "demo", "--set", "dim=16", "--set", "mlp_dim=16", "--epochs", "1",
                 "--batch-size", "4", "--device", "cpu", "--precision", "fp32", "--no-progress", "--out", str(run),
                 *common]) == 0
    last = run / "checkpoints" / "last.safetensors"
    raw = last.read_bytes()
    start = 8 + int.from_bytes(raw[:8], "little")
    meta = json.loads(json.loads(raw[8:start])["__metadata__"]["attncnn"])
    assert (meta["epoch"], meta["step_in_epoch"]) == (1, 0)
    old, new = b'\\"step_in_epoch\\": 0', b'\\"step_in_epoch\\": 3'   # one changed digit
    assert raw[:start].count(old) == 1
    last.write_bytes(raw[:start].replace(old, new) + raw[start:])
    capsys.readouterr()
    for argv in (["evaluate", str(run), "--device", "cpu"],
                 ["train", "--resume", str(run), "--device", "cpu", "--no-progress"]):
        assert main([*argv, *common]) == 2
        err = capsys.readouterr().err
        assert f"{last} is corrupt: its metadata" in err, err
        assert err.strip().count("\n") == 0, err

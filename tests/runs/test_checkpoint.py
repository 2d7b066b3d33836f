"""Safetensors checkpoints: exact resume, metadata, pickle refusal, corruption, atomicity."""

import json
import os
import pickle

import pytest
import safetensors.torch
import torch

from attncnn.runs import checkpoint as ckpt_mod
from attncnn.runs.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def make(seed=0):
    torch.manual_seed(seed)
    model = Tiny()
    opt = torch.optim.SGD([{"params": [model.fc1.weight, model.fc1.bias], "weight_decay": 1e-4},
                           {"params": list(model.bn.parameters()) + list(model.fc2.parameters()),
                            "weight_decay": 0.0, "lr_scale": 0.5}], lr=0.1, momentum=0.9)
    return model, opt


def steps(model, opt, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_round_trip_resumes_bit_identically(tmp_path):
    model, opt = make()
    steps(model, opt, 3, seed=1)
    path = tmp_path / "c.safetensors"
    rng = {"torch_cpu": torch.get_rng_state()}
    save_checkpoint(path, model=model, optimizer=opt, extra_tensors=rng, metadata={"epoch": 3})

    other, other_opt = make(seed=123)            # different initial weights, empty optimizer state
    ck = load_checkpoint(path)
    other.load_state_dict(ck.model_state)
    other_opt.load_state_dict(ck.optimizer_state)
    assert torch.equal(ck.extra_tensors["torch_cpu"], rng["torch_cpu"])
    assert ck.extra_tensors["torch_cpu"].dtype == torch.uint8

    steps(model, opt, 4, seed=2)
    steps(other, other_opt, 4, seed=2)
    for (n1, a), (n2, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert n1 == n2 and torch.equal(a, b), n1
    for s1, s2 in zip(opt.state.values(), other_opt.state.values()):
        assert torch.equal(s1["momentum_buffer"], s2["momentum_buffer"])
    assert other_opt.param_groups[1]["lr_scale"] == 0.5
    assert other_opt.param_groups[0]["weight_decay"] == 1e-4


def test_layout_of_tensor_names(tmp_path):
    model, opt = make()
    steps(model, opt, 1, seed=1)
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, model=model, optimizer=opt, extra_tensors={"rng": torch.zeros(3, dtype=torch.uint8)})
    names = set(safetensors.torch.load_file(str(path)))
    assert "model.fc1.weight" in names and "model.bn.num_batches_tracked" in names
    assert "optim.0.momentum_buffer" in names and "extra.rng" in names
    ck = load_checkpoint(path)
    assert set(ck.model_state) == set(model.state_dict())
    assert ck.metadata == {}


def test_metadata_round_trip_and_no_optimizer(tmp_path):
    model, _ = make()
    meta = {"config": {"lr": 0.1, "milestones": [80, 150, 250], "name": "quadratic"}, "epoch": 7,
            "metrics": {"test_accuracy": 0.8125, "loss": 1e-300}, "flag": True, "none": None}
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model=model, metadata=meta)
    ck = load_checkpoint(path)
    assert ck.metadata == meta
    assert ck.optimizer_state is None and ck.extra_tensors == {}


def test_adam_state_with_tensor_step(tmp_path):
    model, _ = make()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    steps(model, opt, 2, seed=4)
    path = tmp_path / "a.safetensors"
    save_checkpoint(path, model=model, optimizer=opt)
    other, _ = make(seed=5)
    other_opt = torch.optim.Adam(other.parameters(), lr=1e-3, betas=(0.9, 0.98))
    ck = load_checkpoint(path)
    other.load_state_dict(ck.model_state)
    other_opt.load_state_dict(ck.optimizer_state)
    steps(model, opt, 2, seed=6)
    steps(other, other_opt, 2, seed=6)
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)


def test_tied_weights_are_saved(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    model[1].weight = model[0].weight                    # aliased storage: safetensors refuses it as-is
    path = tmp_path / "tied.safetensors"
    save_checkpoint(path, model=model)
    ck = load_checkpoint(path)
    assert torch.equal(ck.model_state["0.weight"], ck.model_state["1.weight"])
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    fresh.load_state_dict(ck.model_state)


def test_non_contiguous_tensors(tmp_path):
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.set_(model.weight.detach().t().contiguous().t())   # non-contiguous view
    assert not model.weight.is_contiguous()
    path = tmp_path / "nc.safetensors"
    save_checkpoint(path, model=model)
    assert torch.equal(load_checkpoint(path).model_state["weight"], model.weight.detach())


def test_creates_parent_folder(tmp_path):
    path = tmp_path / "a" / "b" / "c.safetensors"
    save_checkpoint(path, model=torch.nn.Linear(2, 2))
    assert path.is_file()


def test_unserialisable_metadata_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="JSON serialisable"):
        save_checkpoint(tmp_path / "x.safetensors", model=torch.nn.Linear(2, 2), metadata={"f": object()})
    assert not (tmp_path / "x.safetensors").exists()


# --- refusal of pickles ----------------------------------------------------------------------

class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_torch_save_file_is_refused_as_pickle(tmp_path):
    path = tmp_path / "model.checkpoint"
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "epoch": 1}, path)
    with pytest.raises(CheckpointError, match="is a pickle file; attncnn only loads safetensors checkpoints "
                                              "because unpickling can run arbitrary code"):
        load_checkpoint(path)


def test_legacy_torch_save_is_refused(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="is a pickle file"):
        load_checkpoint(path)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_malicious_pickle_is_never_unpickled(tmp_path, protocol, monkeypatch):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.safetensors"
    path.write_bytes(pickle.dumps(Evil(marker), protocol=protocol))

    def forbid(*a, **k):
        raise AssertionError("pickle must never be used")

    monkeypatch.setattr(pickle, "load", forbid)
    monkeypatch.setattr(pickle, "loads", forbid)
    monkeypatch.setattr(torch, "load", forbid)
    with pytest.raises(CheckpointError, match=r"evil\.safetensors is a pickle file"):
        load_checkpoint(path)
    assert not marker.exists()


def test_protocol_zero_pickle_is_refused(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil0.bin"
    path.write_bytes(pickle.dumps(Evil(marker), protocol=0))
    with pytest.raises(CheckpointError, match="evil0.bin"):
        load_checkpoint(path)
    assert not marker.exists()


# --- corruption ---------------------------------------------------------------------------------

def _good(tmp_path):
    model, opt = make()
    steps(model, opt, 1, seed=0)
    path = tmp_path / "good.safetensors"
    save_checkpoint(path, model=model, optimizer=opt, metadata={"epoch": 1})
    return path


@pytest.mark.parametrize("keep", [0, 5, 8, 12, 100, -10, -1])
def test_truncated_file_names_the_file(tmp_path, keep):
    path = _good(tmp_path)
    data = path.read_bytes()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    with pytest.raises(CheckpointError, match=r"bad\.safetensors"):
        load_checkpoint(bad)


def test_garbage_and_foreign_safetensors(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="junk.safetensors"):
        load_checkpoint(junk)
    foreign = tmp_path / "foreign.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(CheckpointError, match="not an attncnn checkpoint"):
        load_checkpoint(foreign)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.safetensors")


def test_header_length_starting_with_0x80_is_not_mistaken_for_pickle(tmp_path):
    # Pad the metadata until the header length's low byte is 0x80 (as a pickle's PROTO opcode).
    for pad in range(300):
        path = tmp_path / "p.safetensors"
        save_checkpoint(path, model=torch.nn.Linear(2, 2), metadata={"pad": "x" * pad})
        if path.read_bytes()[0] == 0x80:
            break
    else:
        pytest.fail("could not craft the header length")
    assert load_checkpoint(path).metadata["pad"] == "x" * pad


# --- atomicity -----------------------------------------------------------------------------------

def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = _good(tmp_path)
    before = path.read_bytes()
    real = safetensors.torch.save_file

    def half_then_fail(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(50)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_fail)
    model, _ = make(seed=9)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, model=model, metadata={"epoch": 2})
    assert path.read_bytes() == before
    assert load_checkpoint(path).metadata == {"epoch": 1}
    assert _leftovers(tmp_path) == []


def test_failed_rename_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = _good(tmp_path)
    before = path.read_bytes()

    def fail(*a, **k):
        raise OSError("simulated crash at rename")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(path, model=make(seed=3)[0])
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_map_location_cpu_device_object(tmp_path):
    path = _good(tmp_path)
    ck = load_checkpoint(path, map_location=torch.device("cpu"))
    assert all(t.device.type == "cpu" for t in ck.model_state.values())
    assert ckpt_mod.FORMAT_VERSION == "1"


# -- integrity ------------------------------------------------------------------------------------

def _data_start(path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


@pytest.mark.parametrize("where", [0, 0.5, -1])
def test_a_flipped_byte_in_the_tensor_data_is_refused(tmp_path, where):
    model, opt = make()
    steps(model, opt, 2, seed=1)
    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, model=model, optimizer=opt, extra_tensors={"x": torch.arange(5)})
    raw = bytearray(path.read_bytes())
    start = _data_start(path)
    index = start if where == 0 else (len(raw) - 1 if where == -1 else start + (len(raw) - start) // 2)
    raw[index] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=rf"{path} is corrupt: its tensors do not match the digest"):
        load_checkpoint(path)


def test_the_digest_covers_names_and_shapes_and_is_independent_of_the_device_copy(tmp_path):
    a = {"w": torch.arange(6.0).reshape(2, 3)}
    b = {"w": torch.arange(6.0).reshape(3, 2)}
    entries = [(n, t.shape, ckpt_mod._tensor_bytes(t)) for n, t in a.items()]
    other = [(n, t.shape, ckpt_mod._tensor_bytes(t)) for n, t in b.items()]
    assert ckpt_mod._digest(entries) != ckpt_mod._digest(other)
    assert ckpt_mod._digest(entries) != ckpt_mod._digest([("v", *entries[0][1:])])
    model, _ = make()
    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, model=model)
    header = json.loads(path.read_bytes()[8:_data_start(path)])
    assert header["__metadata__"]["digest"].startswith("sha256:")


def test_a_file_without_digest_loads_with_a_warning(tmp_path, caplog):
    model, _ = make()
    path = tmp_path / "old.safetensors"
    save_checkpoint(path, model=model)
    tensors = safetensors.torch.load_file(str(path))
    header = json.loads(path.read_bytes()[8:_data_start(path)])["__metadata__"]
    del header["digest"], header["header_digest"]
    safetensors.torch.save_file(tensors, str(path), metadata=header)
    with caplog.at_level("WARNING"):
        ck = load_checkpoint(path)
    assert "no content digest" in caplog.text
    assert all(torch.equal(ck.model_state[k], v) for k, v in model.state_dict().items())


# -- the header digest: metadata and dtypes ---------------------------------------------------------

def _edit_header(path, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) once inside the file's JSON header, as a flipped
    byte on disk would: the header's length and every tensor byte stay as written."""
    assert len(old) == len(new)
    raw = path.read_bytes()
    start = _data_start(path)
    header = raw[:start]
    assert header.count(old) == 1, header
    path.write_bytes(header.replace(old, new) + raw[start:])


def _resumable(tmp_path):
    model, opt = make()
    steps(model, opt, 2, seed=1)
    path = tmp_path / "last.safetensors"
    save_checkpoint(path, model=model, optimizer=opt, extra_tensors={"rng": torch.arange(4, dtype=torch.uint8)},
                    metadata={"epoch": 1, "step_in_epoch": 3, "config": {"lr": 0.1}})
    return path


def test_a_changed_digit_in_the_metadata_is_refused(tmp_path):
    # An unfinished run's step inside its epoch, edited 3 -> 5: before the header digest it resumed
    # at the wrong step and silently trained a different run.
    path = _resumable(tmp_path)
    _edit_header(path, b'\\"step_in_epoch\\": 3', b'\\"step_in_epoch\\": 5')
    for read in (load_checkpoint, ckpt_mod.read_metadata):
        with pytest.raises(CheckpointError, match=rf"{path} is corrupt: its metadata .* does not match the digest"):
            read(path)


def test_a_changed_optimiser_setting_is_refused(tmp_path):
    path = _resumable(tmp_path)
    raw = path.read_bytes()[:_data_start(path)]
    assert raw.count(b'\\"momentum\\": 0.9') == 2         # one per parameter group
    path.write_bytes(raw.replace(b'\\"momentum\\": 0.9', b'\\"momentum\\": 0.1', 1) + path.read_bytes()[len(raw):])
    with pytest.raises(CheckpointError, match="its metadata .* does not match the digest"):
        load_checkpoint(path)


def test_a_changed_tensor_dtype_is_refused(tmp_path):
    # F32 -> I32 keeps every size and every byte, so the tensor digest alone cannot see it.
    model, _ = make()
    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, model=model)
    header = json.loads(path.read_bytes()[8:_data_start(path)])
    assert header["model.fc1.weight"]["dtype"] == "F32"
    raw = path.read_bytes()
    start = _data_start(path)
    entry = json.dumps({"model.fc1.weight": header["model.fc1.weight"]}, separators=(",", ":"))[1:-1].encode()
    assert raw[:start].count(entry) == 1
    path.write_bytes(raw[:start].replace(entry, entry.replace(b'"F32"', b'"I32"')) + raw[start:])
    with pytest.raises(CheckpointError, match="does not match the digest"):
        load_checkpoint(path)


def test_the_header_digest_is_stable_and_names_every_dtype(tmp_path):
    # What save computed before writing equals what load recomputes from the written header, for
    # every dtype a run stores (bf16 weights, int64 steps, uint8 RNG states, bool masks).
    tensors = {dt: torch.zeros(2, dtype=dt) for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                                        torch.int64, torch.int32, torch.uint8, torch.bool)}
    path = tmp_path / "ck.safetensors"
    ckpt_mod.write_checkpoint(path, ckpt_mod.Checkpoint(model_state={}, optimizer_state=None,
                                                        extra_tensors={str(dt): t for dt, t in tensors.items()}))
    ck = load_checkpoint(path)
    assert {k: v.dtype for k, v in ck.extra_tensors.items()} == {str(dt): dt for dt in tensors}
    assert ckpt_mod._safetensors_dtype(torch.bfloat16) == "BF16"


def test_a_file_with_only_the_tensor_digest_loads_with_a_note_and_keeps_its_tensor_check(tmp_path, caplog):
    # Every shipped run's checkpoints were written before the header digest: they still load, with
    # their tensors checked, and say that their metadata is not covered.
    model, _ = make()
    path = tmp_path / "old.safetensors"
    save_checkpoint(path, model=model, metadata={"epoch": 4})
    tensors = safetensors.torch.load_file(str(path))
    header = json.loads(path.read_bytes()[8:_data_start(path)])["__metadata__"]
    del header["header_digest"]
    safetensors.torch.save_file(tensors, str(path), metadata=header)
    with caplog.at_level("INFO", logger="attncnn.runs.checkpoint"):
        ck = load_checkpoint(path)
    assert ck.metadata == {"epoch": 4}
    assert "its metadata (epoch, step, recipe) is not" in caplog.text
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="its tensors do not match the digest"):
        load_checkpoint(path)


def test_a_full_disk_reported_by_safetensors_is_an_os_error_naming_the_file(tmp_path, monkeypatch):
    # safetensors raises its own SafetensorError for I/O failures; RunFolder.writing turns OSError
    # into "cannot write <file> ...; free some space": before, the full disk ended in a traceback.
    from safetensors import SafetensorError

    from attncnn.runs import RunFolder, RunFolderError

    path = _good(tmp_path)
    before = path.read_bytes()

    def full(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OSError) as caught:
        save_checkpoint(path, model=make(seed=9)[0])
    assert caught.value.errno == 28 and caught.value.filename == str(path)
    run = RunFolder(tmp_path / "run", mode="new")
    target = run.path / "checkpoints" / "last.safetensors"
    with pytest.raises(RunFolderError, match=rf"cannot write {target} .*is full: free some space"):
        with run.writing(target):
            save_checkpoint(target, model=make(seed=9)[0])
    assert path.read_bytes() == before and _leftovers(tmp_path) == []

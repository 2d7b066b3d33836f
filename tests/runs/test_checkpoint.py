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
    del header["digest"]
    safetensors.torch.save_file(tensors, str(path), metadata=header)
    with caplog.at_level("WARNING"):
        ck = load_checkpoint(path)
    assert "no content digest" in caplog.text
    assert all(torch.equal(ck.model_state[k], v) for k, v in model.state_dict().items())

"""The simulated hardware as data: manifests in tuned/data/hardware (tuned.sim.catalog)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuned.data import GPUS_FILE, data_root, hardware_dir
from tuned.sim import catalog, gpu
from tuned.sim.hardware import gpu_hardware


def test_every_packaged_manifest_is_a_hardware_whose_tables_are_packaged():
    manifests = catalog.manifests()
    assert tuple(manifests) == gpu.HARDWARE
    assert set(gpu.VIDUR_HARDWARE) | set(gpu.MEASURED_HARDWARE) == set(gpu.HARDWARE)
    assert {"a100-llama2-7b", "h100-llama2-70b", "h200-qwen2.5-coder-3b"} <= set(manifests)
    for name, m in manifests.items():
        assert (data_root() / m.tables / "mlp.csv").is_file(), name
        assert gpu.default_data_dir(name) / gpu.profile_relpath(name) == \
            data_root() / m.tables / "mlp.csv"
        if m.decode_attention_measured:
            assert (data_root() / m.tables / "attention.csv").is_file(), name


def test_a_hardware_takes_vllms_defaults_and_shape_from_its_manifest():
    m = catalog.manifests()["a100-llama2-70b"]
    assert (m.gpu.name, m.num_layers, m.tensor_parallel) == ("a100", 80, 4)
    hw = gpu_hardware("a100-llama2-70b")
    assert (hw.vllm_default_max_num_seqs, hw.vllm_default_max_num_batched_tokens) == (256, 2048)
    h200 = gpu_hardware("h200-llama2-7b")
    assert (h200.vllm_default_max_num_seqs, h200.vllm_default_max_num_batched_tokens) == \
        (1024, 8192)
    assert h200.step_model.describe()["decode_attention"]["scaling"].startswith("none")
    assert hw.step_model.describe()["decode_attention"]["scaling"].startswith("a_req")


def test_the_help_of_both_commands_lists_every_manifest():
    for cmd in ("simulate", "bench"):
        out = subprocess.run([sys.executable, "-m", "tuned", cmd, "--help"],
                             capture_output=True, text=True, check=True,
                             env={"COLUMNS": "1000", "PATH": ""}).stdout
        for name, m in catalog.manifests().items():
            assert f"{name}: {m.summary}" in out, (cmd, name)


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "hardware"
    shutil.copytree(hardware_dir(), folder)
    return folder


def test_adding_a_manifest_adds_a_hardware(tmp_path):
    folder = _copy(tmp_path)
    text = (folder / "h200-llama2-7b.toml").read_text()
    (folder / "h200-llama2-7b-tp2.toml").write_text(
        text.replace("tensor_parallel = 1", "tensor_parallel = 2"))
    found = catalog.read_manifests(folder)
    assert set(found) == set(catalog.manifests()) | {"h200-llama2-7b-tp2"}
    assert found["h200-llama2-7b-tp2"].tensor_parallel == 2
    assert found["h200-llama2-7b-tp2"].gpu == catalog.gpus()["h200"]


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('gpu = "a100"', 'gpu = "a101"'),
     "a100-llama2-7b.toml: 'gpu' must be one of a100, h100, h200 (gpus.toml), got 'a101'"),
    (lambda t: t.replace('decode_attention = "reference"', 'decode_attention = "guess"'),
     "a100-llama2-7b.toml: 'decode_attention' must be one of reference, measured, "
     "got 'guess'"),
    (lambda t: t.replace('tables = "vidur/a100/Llama-2-7b-hf"', 'tables = "a100/mlp.csv"'),
     "a100-llama2-7b.toml: 'tables' must be <data folder>/<gpu>/<model folder>, "
     "got 'a100/mlp.csv'"),
    (lambda t: t.replace("num_layers = 32", "num_layers = -32"),
     "a100-llama2-7b.toml [shape]: 'num_layers' must be >= 0, got -32"),
    (lambda t: t.replace("num_layers = 32", 'num_layers = "32"'),
     "a100-llama2-7b.toml [shape]: 'num_layers' must be int, got '32'"),
    (lambda t: t.replace("max_num_seqs = 256\n", ""),
     "a100-llama2-7b.toml [vllm]: 'max_num_seqs' is missing"),
])
def test_a_bad_manifest_is_refused_naming_its_file_and_field(tmp_path, edit, message):
    folder = _copy(tmp_path)
    path = folder / "a100-llama2-7b.toml"
    path.write_text(edit(path.read_text()))
    with pytest.raises(ValueError) as e:
        catalog.read_manifests(folder)
    assert str(e.value) == message


def test_a_bad_gpu_is_refused_naming_the_gpu(tmp_path):
    folder = _copy(tmp_path)
    path = folder / GPUS_FILE
    path.write_text(path.read_text().replace("hbm_bytes_per_s = 2.039e12\n", ""))
    with pytest.raises(ValueError, match=r"^gpus.toml \[a100\]: 'hbm_bytes_per_s' is missing$"):
        catalog.read_manifests(folder)


def test_an_unknown_hardware_names_the_known_ones():
    with pytest.raises(ValueError) as e:
        gpu.load_hardware("b200-llama2-7b")
    assert str(e.value) == ("unknown hardware 'b200-llama2-7b'; known: "
                            + ", ".join(gpu.HARDWARE))

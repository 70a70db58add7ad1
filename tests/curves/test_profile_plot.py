"""The profile plot is a real PNG written beside the profile."""

import json
from pathlib import Path

from tuned.curves.plot import plot_path_for, plot_profile
from tuned.curves.profile import build_profile, load_profile, save_profile

from fakes import META, V1, make_samples

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_path_is_beside_the_profile():
    assert plot_path_for("profiles/demo-tiny-cpu.json") == Path("profiles/demo-tiny-cpu.png")


def test_plot_writes_png_beside_profile(tmp_path):
    req, steps = make_samples()
    p = build_profile(json.loads(json.dumps(META)), req, steps)
    path = save_profile(p, tmp_path / "demo.json")
    p.source = str(path)
    out = plot_profile(p)
    assert out == tmp_path / "demo.png"
    assert out.stat().st_size > 20_000
    assert png_size(out) == (1600, 480)


def test_plot_of_migrated_v1_profile_without_samples(tmp_path):
    p = load_profile(V1)
    out = plot_profile(p, tmp_path / "v1.png")
    assert out.stat().st_size > 10_000
    assert png_size(out) == (1600, 480)

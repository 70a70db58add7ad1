"""The bench's plots, read from the figure objects: titles with units, labelled axes,
legends outside the data, the cap drawn across the whole run, tuned picked out from
the static sweep."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from tuned.bench import report as report_mod  # noqa: E402
from tuned.bench.metrics import CAPACITY_TARGET  # noqa: E402

STATICS = [f"static-{c}@{b}" for c in (1, 2, 4, 8, 16, 32, 64) for b in (512, 8192)]
DURATION_S = 31.5


def run(name: str, kind: str, goodput: float, attainment: float) -> dict:
    return {"name": name, "kind": kind, "goodput_rps": goodput, "attainment": attainment,
            "duration_s": DURATION_S}


@pytest.fixture
def report() -> dict:
    runs = [run("vllm-default", "static", 6.0, 0.6)]
    runs += [run(n, "static", 0.3 * i, min(1.0, 0.08 * i)) for i, n in enumerate(STATICS)]
    runs += [run("trtllm", "peer", 6.0, 0.6), run("sglang", "peer", 6.1, 0.61),
             run("tuned", "tuned", 9.5, 0.95), run("tuned-cap-only", "ablation", 7.0, 0.7)]
    return {"engine": "sim", "hardware": "a100-llama2-7b", "workload": "phase-shift:rate=12",
            "slo": "ttft=2,tpot=0.05",
            "slo_parsed": {"ttft_s": 2.0, "tpot_s": 0.05, "e2el_s": None}, "runs": runs,
            "best_static": {"by_goodput": "static-32@512", "by_capacity": "static-32@512"}}


@pytest.fixture
def timelines() -> dict:
    # tuned's cap never moved: one point, at the start
    tbt = [(float(t), 0.02) for t in range(31)]
    return {"tuned": {"cap": [(0.0, 32)], "tbt": tbt},
            "static-32@512": {"cap": [(0.0, 32)], "tbt": tbt},
            "vllm-default": {"cap": [(0.0, 256)], "tbt": [(t, 0.08) for t, _ in tbt]}}


@pytest.fixture
def probes(report) -> dict:
    return {r["name"]: [(2.0, 1.0), (8.0, 0.95), (16.0, 0.4)] for r in report["runs"]}


def outside(fig, ax, legend) -> bool:
    """True when the legend's box and the axes' box do not overlap on the canvas."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return not legend.get_window_extent(r).overlaps(ax.get_window_extent(r))


def test_cap_line_reaches_the_end_of_the_run():
    assert report_mod._cap_line([(0.0, 32)], 30.0) == ([0.0, 30.0], [32, 32])
    assert report_mod._cap_line([(0.0, 8), (10.0, 16)], 30.0) == ([0.0, 10.0, 30.0],
                                                                  [8, 16, 16])
    # a timeline that already ends later is kept as it is
    assert report_mod._cap_line([(0.0, 8), (31.0, 16)], 30.0) == ([0.0, 31.0], [8, 16])


def test_timeline(report, timelines):
    fig = report_mod.timeline_figure(report, timelines)
    cap_ax, tbt_ax = fig.axes
    lines = {ln.get_label(): ln for ln in cap_ax.get_lines()}
    assert set(lines) == {"tuned", "best static pair (static-32@512)", "vLLM default"}
    for label, line in lines.items():
        # one cap all run long: a line from the first arrival to the run's end
        assert list(line.get_xdata()) == [0.0, DURATION_S], label
        assert len(set(line.get_ydata())) == 1, label
    assert lines["tuned"].get_linewidth() > lines["vLLM default"].get_linewidth()
    assert to_hex(lines["tuned"].get_color()) == report_mod.STYLE["tuned"][1]
    # tuned and the best pair share cap 32: told apart by line style
    assert lines["tuned"].get_linestyle() != lines["best static pair (static-32@512)"] \
        .get_linestyle()
    lo, hi = cap_ax.get_ylim()
    assert lo < 32 and hi > 256
    assert cap_ax.get_title(loc="left") == "Applied cap on running sequences (sequences, " \
                                          "log scale)"
    assert tbt_ax.get_title(loc="left") == "Time between tokens (ms, mean of each second)"
    assert cap_ax.get_ylabel() == "cap (sequences)" and tbt_ax.get_ylabel() == "TBT (ms)"
    assert tbt_ax.get_xlabel() == "time since the first arrival (s)"
    assert "TPOT SLO (50 ms)" in [ln.get_label() for ln in tbt_ax.get_lines()]
    for ax in fig.axes:
        assert outside(fig, ax, ax.get_legend())
    assert fig._suptitle.get_text().startswith("Cap and time between tokens over the run")


def test_goodput(report):
    fig = report_mod.goodput_figure(report)
    top, bottom = fig.axes
    assert top.get_ylabel() == "goodput (req/s)"
    assert bottom.get_ylabel() == "attainment (fraction)"
    assert "(req/s)" in top.get_title(loc="left") and "fraction" in bottom.get_title(loc="left")
    assert bottom.get_xlabel().startswith("contender")
    assert "SLO TTFT 2 s, TPOT 50 ms" in fig._suptitle.get_text()
    names = [r["name"] for r in report["runs"]]
    colors = dict(zip(names, (to_hex(b.get_facecolor()) for b in top.patches)))
    style = {k: c for k, (_, c) in report_mod.STYLE.items()}
    assert colors["tuned"] == style["tuned"]
    assert colors["vllm-default"] == style["vllm-default"]
    assert colors["static-32@512"] == style["best"]
    assert {colors[n] for n in STATICS if n != "static-32@512"} == {style["static"]}
    assert colors["trtllm"] == colors["sglang"] == style["peer"]
    legend = top.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "tuned", "vLLM default", "best static pair (static-32@512)",
        "static (cap, budget) pair", "TensorRT-LLM / SGLang rule", "tuned ablation"]
    assert outside(fig, top, legend) and outside(fig, bottom, legend)
    # tuned's bar carries its value
    assert "9.50" in [t.get_text() for t in top.texts]


def test_capacity(report, probes):
    fig = report_mod.capacity_figure(report, probes)
    [ax] = fig.axes
    assert ax.get_xlabel() == "arrival rate (req/s)"
    assert ax.get_ylabel() == "SLA attainment (fraction of requests)"
    assert f">= {CAPACITY_TARGET:g}" in ax.get_title()
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    # the 13 other static pairs: one grey legend entry, not 13 entries on a colour cycle
    assert labels.count("static (cap, budget) pairs (13)") == 1
    assert not [s for s in STATICS if s in labels]
    assert f"attainment {CAPACITY_TARGET:g} (capacity threshold)" in labels
    assert outside(fig, ax, legend)
    lines = ax.get_lines()
    grey = [ln for ln in lines if to_hex(ln.get_color()) == report_mod.STYLE["static"][1]]
    assert len(grey) == 13
    [tuned] = [ln for ln in lines if ln.get_label() == "tuned"]
    [default] = [ln for ln in lines if ln.get_label() == "vLLM default"]
    assert tuned.get_linewidth() > default.get_linewidth() > max(g.get_linewidth()
                                                                  for g in grey)
    assert tuned.get_zorder() > max(ln.get_zorder() for ln in lines if ln is not tuned)
    # tuned, vLLM's default, the best pair, the peers and the ablations: five colours
    color = {ln.get_label(): to_hex(ln.get_color()) for ln in lines}
    kinds = ["tuned", "vLLM default", "best static pair (static-32@512)", "trtllm",
             "tuned-cap-only"]
    assert len({color[k] for k in kinds} | {report_mod.STYLE["static"][1]}) == 6
    assert color["trtllm"] == color["sglang"]


def test_plots_writes_every_file(report, timelines, probes, tmp_path):
    files = report_mod.plots(report, timelines, probes, tmp_path)
    assert [f.name for f in files] == ["goodput.png", "timeline.png", "capacity.png"]
    assert all(f.stat().st_size > 20_000 for f in files)
    # without timelines or probes, only the goodput plot
    assert [f.name for f in report_mod.plots(report, {}, {}, tmp_path)] == ["goodput.png"]

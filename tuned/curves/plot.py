"""PNG plot of a profile: throughput and per-request speed vs concurrency, step time vs
decode batch, each with its samples and fitted curves (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tuned.curves.models import usl_speed  # noqa: E402
from tuned.curves.profile import Profile  # noqa: E402


def plot_path_for(profile_path: str | Path) -> Path:
    """The PNG written beside a profile: same folder and stem, ``.png``."""
    return Path(profile_path).with_suffix(".png")


def plot_profile(profile: Profile, out: str | Path | None = None) -> Path:
    """Draw the profile into ``out`` (default: beside ``profile.source``); return the path."""
    if out is None:
        if not profile.source:
            raise ValueError("plot_profile: no output path and the profile has no source file")
        out = plot_path_for(profile.source)
    out = Path(out)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    try:
        _throughput(axes[0], profile)
        _speed(axes[1], profile)
        _step_time(axes[2], profile)
        model = Path(profile.meta.get("model", {}).get("path", "?")).name
        hw = profile.meta.get("hardware", {})
        fig.suptitle(f"tuned profile: {model} on {hw.get('gpu') or hw.get('cpu_model') or '?'}"
                     f" — {profile.meta.get('workload', {}).get('spec', '')}", fontsize=10)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out


def _grid(levels: list[dict], xs=()) -> np.ndarray:
    hi = max([lv["concurrency"] for lv in levels] + list(xs) + [2])
    return np.linspace(1, hi * 1.1, 200)


def _throughput(ax, p: Profile) -> None:
    ax.set_title("throughput vs concurrency")
    ax.set_xlabel("requests in flight N")
    ax.set_ylabel("output tokens/s")
    if p.levels:
        n = [lv["concurrency"] for lv in p.levels]
        ax.plot(n, [lv["throughput_tok_s"] for lv in p.levels], "o", label="measured")
        if p.usl is not None:
            g = _grid(p.levels)
            ax.plot(g, p.usl.predict(g), "-", label=f"USL fit (R²={p.usl.r2:.3f})")
    _finish(ax)


def _speed(ax, p: Profile) -> None:
    ax.set_title("per-request speed vs concurrency")
    ax.set_xlabel("requests in flight N")
    ax.set_ylabel("tokens/s per request")
    xs: list = []
    if p.requests.get("speed_tok_s"):
        xs = p.requests.get("load") or p.requests["concurrency"]
        ax.plot(xs, p.requests["speed_tok_s"], ".", alpha=0.3, color="gray", label="requests")
    if p.levels:
        ax.plot([lv["concurrency"] for lv in p.levels],
                [lv["speed_tok_s_mean"] for lv in p.levels], "o", color="C0",
                label="level mean")
        g = _grid(p.levels, xs)
        for short, f in p.speed.items():
            style = "-" if short == p.best_speed else "--"
            ax.plot(g, f.predict(g), style, label=f"{short} (R²={f.r2:.3f})"
                    + (" best" if short == p.best_speed else ""))
        if not p.speed and p.usl is not None:
            ax.plot(g, usl_speed(g, **p.usl.params), "-", label="USL X(N)/N")
    _finish(ax)


def _step_time(ax, p: Profile) -> None:
    ax.set_title("engine step time vs decode batch")
    ax.set_xlabel("decoding sequences in the step b")
    ax.set_ylabel("step time (ms)")
    b = np.asarray(p.steps.get("num_decode", []), dtype=float)
    if b.size:
        c = np.asarray(p.steps["prefill_tokens"], dtype=float)
        t = np.asarray(p.steps["step_s"], dtype=float) * 1e3
        dec = c == 0
        ax.plot(b[dec], t[dec], ".", alpha=0.3, label="decode-only steps")
        if (~dec).any():
            ax.plot(b[~dec], t[~dec], "x", alpha=0.3, label="steps with prefill")
        if p.step_time is not None:
            g = np.linspace(max(b.min(), 1), max(b.max(), 2), 100)
            label = f"{p.step_time.name} fit, c=0"
            if p.step_time.name == "step_time_kv":
                kv = np.asarray(p.steps["kv_tokens_resident"], dtype=float)[dec]
                kv_mean = float(kv.mean()) if kv.size else 0.0
                args = (g, 0, kv_mean)
                label += f", kv={kv_mean:.0f}"
            else:
                args = (g, 0)
            label += f" (R²={p.step_time.r2:.3f})"
            ax.plot(g, np.asarray(p.step_time.predict(*args)) * 1e3, "-", color="C3",
                    label=label)
    elif p.levels and (p.speed or p.usl is not None):
        g = np.arange(1, max(lv["concurrency"] for lv in p.levels) + 1)
        ax.plot(g, [p.predict_step_s(int(x)) * 1e3 for x in g], "o-",
                label="1 / v(b) (no step samples)")
    else:
        ax.text(0.5, 0.5, "no step samples", ha="center", va="center", transform=ax.transAxes)
    _finish(ax)


def _finish(ax) -> None:
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)

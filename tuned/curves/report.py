"""A profile as text: what `tuned profile show`, `profile fit` and `profile` print.

The :class:`~tuned.curves.profile.Profile` holds the data and the fits; the words about
them live here.
"""

from __future__ import annotations

import math

from tuned.curves.fit import FitResult
from tuned.curves.models import usl_peak_concurrency
from tuned.curves.profile import SCHEMA_VERSION, Profile


def profile_summary(profile: Profile) -> str:
    """Readable description: where it came from, the levels and the fits."""
    m = profile.meta
    model = m.get("model", {})
    cfg = model.get("config") or {}
    hw = m.get("hardware", {})
    lines = [f"profile: {profile.source or '(in memory)'} (schema {SCHEMA_VERSION}"
             + (f", migrated from schema {profile.migrated_from}" if profile.migrated_from
                else "") + ")"]
    desc = model.get("path", "?")
    if cfg:
        bits = [str(cfg[k]) for k in ("architecture",) if cfg.get(k)]
        if cfg.get("num_layers"):
            bits.append(f"{cfg['num_layers']} layers")
        if cfg.get("num_kv_heads") and cfg.get("head_dim"):
            bits.append(f"{cfg['num_kv_heads']} KV heads x {cfg['head_dim']}")
        if cfg.get("dtype"):
            bits.append(str(cfg["dtype"]))
        if cfg.get("kv_bytes_per_token"):
            bits.append(f"{cfg['kv_bytes_per_token']} B KV/token")
        desc += f" ({', '.join(bits)})" if bits else ""
    lines.append(f"model: {desc}")
    if hw:
        gpu = hw.get("gpu") or "no GPU"
        lines.append(f"hardware: {hw.get('cpu_model', '?')} ({hw.get('cpu_cores', '?')} "
                     f"cores), {gpu}")
    lines.append(f"software: vLLM {m.get('vllm_version') or '?'}, tuned "
                 f"{m.get('tuned_version') or '?'}; created {m.get('created_at', '?')}")
    wl = m.get("workload", {})
    if wl.get("spec"):
        lines.append(f"workload: {wl['spec']}")
    eng = m.get("engine") or {}
    if eng:
        lines.append("engine: " + ", ".join(f"{k}={v}" for k, v in eng.items()
                                            if v is not None))
    sweep = m.get("sweep") or {}
    if sweep.get("interrupted"):
        lines.append("sweep: INTERRUPTED, only the levels below were measured")
    n_req = len(profile.requests.get("concurrency", []))
    n_step = len(profile.steps.get("step_s", []))
    lines.append(f"samples: {n_req} requests, {n_step} engine steps")
    if profile.levels:
        lines.append("")
        lines.append(f"{'N':>5} {'requests':>9} {'throughput tok/s':>17} "
                     f"{'speed tok/s':>12} {'step ms':>8}")
        for lv in profile.levels:
            step = lv.get("step_s_mean")
            step_ms = f"{step * 1e3:.2f}" if step is not None else "-"
            lines.append(f"{lv['concurrency']:>5} {lv['num_requests']:>9} "
                         f"{lv['throughput_tok_s']:>17.1f} {lv['speed_tok_s_mean']:>12.2f} "
                         f"{step_ms:>8}")
    lines.append("")
    lines.append("fits:")
    if profile.usl is not None:
        p = profile.usl.params
        peak = usl_peak_concurrency(p["sigma"], p["kappa"])
        # kappa within noise of 0 puts N* far past anything measured: say so
        # rather than print an eight-digit concurrency
        top = max((lv["concurrency"] for lv in profile.levels), default=0)
        peak_text = (f"peak at N*={peak:.1f}" if peak <= 10 * max(top, 1)
                     else "no peak within 10x the measured levels")
        lines.append(f"  throughput (USL): {_params_text(profile.usl)}; R²={profile.usl.r2:.4f} "
                     f"(n={profile.usl.n_samples}); {peak_text}")
    else:
        lines.append("  throughput (USL): none")
    if profile.speed:
        parts = [f"{k} R²={f.r2:.4f}" for k, f in profile.speed.items()]
        lines.append(f"  speed v(N): {' | '.join(parts)} -> best {profile.best_speed}")
        best = profile.speed[profile.best_speed]
        lines.append(f"    {profile.best_speed}: {_params_text(best)} (n={best.n_samples})")
    else:
        lines.append("  speed v(N): none")
    if profile.step_time is not None:
        f = profile.step_time
        lines.append(f"  step time ({f.name}): {_params_text(f)}; R²={f.r2:.4f} "
                     f"(n={f.n_samples})")
        if f.note:
            lines.append(f"    {f.note}")
        if profile.step_gap_s > 0:
            lines.append(f"    between back-to-back steps, unmeasured by them: median "
                         f"{profile.step_gap_s * 1e3:.2f} ms (scheduler, output handling)")
    else:
        lines.append("  step time: none (predictions use 1 / v(b))")
    if profile.kv is not None:
        lines.append(f"  KV demand per request: mean {profile.kv.mean:.1f} tokens, "
                     f"std {math.sqrt(profile.kv.var):.1f} (n={profile.kv_n})")
    for note in profile.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _params_text(f: FitResult) -> str:
    parts = []
    for k, v in f.params.items():
        e = f.stderr.get(k)
        parts.append(f"{k}={v:.4g}" + (f"±{e:.2g}" if e is not None else ""))
    return ", ".join(parts)

#!/usr/bin/env python3
"""Adds the cross-framework comparison lines to bench/results/latest.jsonl (all values
were measured earlier in the same `make bench` run) and prints a summary table.

  python3 bench/summarize.py bench/results/latest.jsonl

A comparison line has `value` (DistJax), `baseline`, `baseline_value` and `ratio`,
where ratio > 1 means DistJax is better (`better`: "higher" for throughputs).
"""
import json
import sys


def load(path):
    recs = []
    with open(path) as f:
        for ln in f:
            ln = ln.strip()
            if ln:
                try:
                    recs.append(json.loads(ln))
                except json.JSONDecodeError:
                    pass
    return recs


def best_by_name(recs):
    """name -> the record with the highest value (runs repeated in rounds), plus the
    list of all values of that name."""
    best, values = {}, {}
    for r in recs:
        n, v = r.get("name"), r.get("value")
        if n is None:
            continue
        values.setdefault(n, []).append(v)
        if n not in best or (isinstance(v, (int, float)) and
                             (not isinstance(best[n].get("value"), (int, float)) or v > best[n]["value"])):
            best[n] = r
    return best, values


def run_peaks(recs):
    """threads -> best measured FP32 peak (GFLOP/s) of any peak line in this run."""
    peaks = {}
    for r in recs:
        if str(r.get("name", "")).startswith("peak_fp32") and isinstance(r.get("value"), (int, float)):
            t = r.get("threads")
            peaks[t] = max(peaks.get(t, 0.0), r["value"])
    return peaks


def comparisons(by_name, values, peaks):
    out = []
    for model, unit in (("mlp", "examples_per_s"), ("gpt", "tokens_per_s")):
        def get(fw, tag):
            return f"{fw}_{model}_train_{unit}_{tag}", by_name.get(f"{fw}_{model}_train_{unit}_{tag}")
        ours_default = get("distjax", "threads_default")
        ours_1 = get("distjax", "threads_1")
        pairs = [
            (f"{model}_train_{unit}_vs_pytorch", ours_default, get("pytorch", "threads_default"), 1.5,
             "both at their default threads"),
            (f"{model}_train_{unit}_vs_jax", ours_default, get("jax", "threads_default"), None,
             "both at their default threads; JAX = one jitted step"),
            (f"{model}_train_{unit}_vs_pytorch_1thread", ours_1, get("pytorch", "threads_1"), None,
             "both restricted to 1 thread (PyTorch: set_num_threads(1), OPENBLAS_NUM_THREADS=1)"),
        ]
        # No comparison with pytorch_*_threads_2: with set_num_threads(2) PyTorch's OpenMP
        # team and OpenBLAS's own pthreads oversubscribe the 2 cores and it collapses
        # (10-25x slower than its default), which would flatter DistJax.
        pairs.append((f"{model}_train_{unit}_vs_pytorch_omp_passive",
                      get("distjax", "threads_default_omp_passive"), get("pytorch", "threads_default"),
                      None, "DistJax with OMP_WAIT_POLICY=PASSIVE vs PyTorch at its defaults"))
        pairs.append((f"{model}_train_{unit}_vs_jax_omp_passive",
                      get("distjax", "threads_default_omp_passive"), get("jax", "threads_default"),
                      None, "DistJax with OMP_WAIT_POLICY=PASSIVE vs JAX at its defaults"))
        for name, (oname, ours), (bname, base), target, how in pairs:
            if not ours or not base or not base.get("value") or not ours.get("value"):
                continue
            rec = {"name": name, "value": ours["value"], "unit": ours["unit"],
                   "baseline": f"{base['framework']} {base.get('version', '')} ({bname})",
                   "baseline_value": base["value"], "ratio": ours["value"] / base["value"],
                   "better": "higher", "how": how + "; best round of each",
                   "values_by_round": values.get(oname), "baseline_values_by_round": values.get(bname),
                   "threads": ours.get("threads"), "baseline_threads": base.get("threads"),
                   "gflops": ours.get("gflops"), "baseline_gflops": base.get("gflops")}
            try:  # the same comparison from each side's fastest single step
                rec["ratio_fastest_step"] = base["step_time_min_s"] / ours["step_time_min_s"]
            except (KeyError, TypeError, ZeroDivisionError):
                pass
            peak = peaks.get(ours.get("threads"))
            if peak and ours.get("gflops"):
                rec["fraction_of_peak"] = ours["gflops"] / peak
                rec["peak_gflops"] = peak
            if base.get("blas"):
                rec["baseline_blas"] = base["blas"]
            if target:
                rec["target"] = target
                rec["meets_target"] = rec["ratio"] >= target
            out.append(rec)
    out.extend(tp_comparisons(by_name, values))
    return out


def tp_comparisons(by_name, values):
    """tp_gpt_vs_jax_shard_map: the tensor-parallel GPT step (Megatron over 2 devices, one
    thread each) of DistJax (bench_tp) against bench/reference/jax_tp_gpt.py, each side's
    best round (the JAX line is only measured in round 1)."""
    oname, bname = "distjax_gpt_tp2_train_tokens_per_s", "jax_gpt_tp2_train_tokens_per_s"
    ours, base = by_name.get(oname), by_name.get(bname)
    if not ours or not base or not ours.get("value") or not base.get("value"):
        return []
    rec = {"name": "tp_gpt_vs_jax_shard_map", "value": ours["value"], "unit": ours["unit"],
           "baseline": f"{base.get('framework', 'jax')} {base.get('version', '')} ({bname})",
           "baseline_value": base["value"], "ratio": ours["value"] / base["value"],
           "better": "higher",
           "how": "GPT train step, Megatron TP over (model=2), one thread per device, same "
                  "model, AdamW and global batch; tokens/s of the global batch; best round of each",
           "values_by_round": values.get(oname), "baseline_values_by_round": values.get(bname),
           "devices": ours.get("devices"), "baseline_devices": base.get("devices"),
           "threads_per_device": ours.get("threads_per_device"),
           "baseline_threads_per_device": base.get("threads_per_device"),
           "round": ours.get("round"), "baseline_round": base.get("round")}
    try:  # the same comparison from each side's fastest single step
        rec["ratio_fastest_step"] = base["step_time_min_s"] / ours["step_time_min_s"]
    except (KeyError, TypeError, ZeroDivisionError):
        pass
    return [rec]


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        a = abs(v)
        if a >= 1e5:
            return f"{v:.3g}"
        if a >= 100:
            return f"{v:.0f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    return str(v)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/latest.jsonl"
    recs = load(path)
    by_name, values = best_by_name(recs)
    peaks = run_peaks(recs)
    new = [c for c in comparisons(by_name, values, peaks) if c["name"] not in by_name]
    with open(path, "a") as f:
        for c in new:
            f.write(json.dumps(c) + "\n")
    for c in new:
        by_name[c["name"]] = c
        values[c["name"]] = [c["value"]]

    rows = []
    for name, r in by_name.items():
        note = ""
        gf = r.get("gflops") if r.get("gflops") is not None else (
            r.get("value") if r.get("unit") == "GFLOP/s" and not name.startswith("peak") else None)
        peak = peaks.get(r.get("threads"))
        if isinstance(gf, (int, float)) and peak:
            note = f"{100 * gf / peak:.0f}% of peak"
        if len(values.get(name, [])) > 1:
            note = (note + f" best of {len(values[name])}").strip()
        if r.get("unit") == "unavailable":
            note = str(r.get("reason", ""))[:60]
        rows.append((name, fmt(r.get("value")), r.get("unit", ""),
                     fmt(r.get("baseline_value")), fmt(r.get("ratio")), note))
    w = [max(len(str(x[i])) for x in rows + [("name", "value", "unit", "baseline", "ratio", "")])
         for i in range(6)]
    w[0] = min(w[0], 60)
    print()
    print("DistJax benchmark summary  (ratio > 1: DistJax better; baselines measured in this run;")
    print(f"peaks: {', '.join(f'{t} thread(s) {p:.0f} GFLOP/s' for t, p in sorted(peaks.items(), key=lambda kv: str(kv[0])))})")
    hdr = ("name", "value", "unit", "baseline", "ratio", "note")
    print("  ".join(str(h).ljust(w[i]) for i, h in enumerate(hdr)))
    print("  ".join("-" * w[i] for i in range(6)))
    for row in rows:
        print("  ".join(str(c)[:w[i]].ljust(w[i]) if i in (0, 2, 5) else str(c).rjust(w[i])
                        for i, c in enumerate(row)))
    print()
    for c in new:
        if "target" in c:
            print(f"{c['name']}: ratio {c['ratio']:.2f} vs target {c['target']} -> "
                  f"{'met' if c['meets_target'] else 'NOT met'}")
    g = by_name.get("gemm_ratio_mean_vs_sgemm")
    if g:
        print(f"GEMM vs dnnl_sgemm (1 thread): mean ratio {g['value']:.2f}, min {g.get('ratio_min', 0):.2f} "
              f"(target {g.get('target', 0.9)})")


if __name__ == "__main__":
    main()

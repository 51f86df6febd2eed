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


def comparisons(by_name):
    out = []
    for model, unit in (("mlp", "examples_per_s"), ("gpt", "tokens_per_s")):
        ours_default = by_name.get(f"distjax_{model}_train_{unit}_threads_default")
        ours_1 = by_name.get(f"distjax_{model}_train_{unit}_threads_1")
        pairs = [
            (f"{model}_train_{unit}_vs_pytorch", ours_default,
             by_name.get(f"pytorch_{model}_train_{unit}_threads_default"), 1.5,
             "both at their default threads"),
            (f"{model}_train_{unit}_vs_jax", ours_default,
             by_name.get(f"jax_{model}_train_{unit}_threads_default"), None,
             "both at their default threads; JAX = one jitted step"),
            (f"{model}_train_{unit}_vs_pytorch_1thread", ours_1,
             by_name.get(f"pytorch_{model}_train_{unit}_threads_1"), None,
             "both restricted to 1 thread (PyTorch: set_num_threads(1), OPENBLAS_NUM_THREADS=1)"),
        ]
        if ours_default and ours_default.get("threads") == 2:
            pairs.append((f"{model}_train_{unit}_vs_pytorch_2threads", ours_default,
                          by_name.get(f"pytorch_{model}_train_{unit}_threads_2"), None,
                          "both on 2 threads (PyTorch: set_num_threads(2))"))
        passive = by_name.get(f"distjax_{model}_train_{unit}_threads_default_omp_passive")
        pairs.append((f"{model}_train_{unit}_vs_pytorch_omp_passive", passive,
                      by_name.get(f"pytorch_{model}_train_{unit}_threads_default"), None,
                      "DistJax with OMP_WAIT_POLICY=PASSIVE vs PyTorch at its defaults"))
        for name, ours, base, target, how in pairs:
            if not ours or not base or not base.get("value") or not ours.get("value"):
                continue
            rec = {"name": name, "value": ours["value"], "unit": ours["unit"],
                   "baseline": f"{base['framework']} {base.get('version', '')} ({base['name']})",
                   "baseline_value": base["value"], "ratio": ours["value"] / base["value"],
                   "better": "higher", "threads": ours.get("threads"),
                   "baseline_threads": base.get("threads"), "how": how,
                   "gflops": ours.get("gflops"), "baseline_gflops": base.get("gflops"),
                   "fraction_of_peak": ours.get("fraction_of_peak")}
            if base.get("blas"):
                rec["baseline_blas"] = base["blas"]
            if target:
                rec["target"] = target
                rec["meets_target"] = rec["ratio"] >= target
            out.append(rec)
    return out


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
    by_name = {r.get("name"): r for r in recs}
    new = [c for c in comparisons(by_name) if c["name"] not in by_name]
    with open(path, "a") as f:
        for c in new:
            f.write(json.dumps(c) + "\n")
    recs += new

    rows = []
    for r in recs:
        extra = ""
        if "fraction_of_peak" in r and r["fraction_of_peak"] is not None:
            extra = f"{100 * r['fraction_of_peak']:.0f}% peak"
        if r.get("unit") == "unavailable":
            extra = str(r.get("reason", ""))[:60]
        rows.append((r.get("name", "?"), fmt(r.get("value")), r.get("unit", ""),
                     fmt(r.get("baseline_value")), fmt(r.get("ratio")), extra))
    w = [max(len(str(x[i])) for x in rows + [("name", "value", "unit", "baseline", "ratio", "")])
         for i in range(6)]
    w[0] = min(w[0], 58)
    print()
    print("DistJax benchmark summary  (ratio > 1: DistJax better; baselines measured in this run)")
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


if __name__ == "__main__":
    main()

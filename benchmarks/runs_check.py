"""The whole runs catalog through `runs check` and `fit`: where the model stands, measured.

1. Every row of ``hwspecs/data/runs/train.json`` predicted with its published layout pinned, by the ideal model (``--profile none``) and with the shipped
   profiles: n, MAPE, median signed error and the share within ±20%, per accelerator.
2. Each shipped profile (per accelerator, and per accelerator and stack) refitted from the
   train catalog: in-sample, k-fold by source family (by configuration group where one
   family is all there is) and leave-one-source-out MAPE, with the worst family.
3. The test targets (never fitted on, never shipped: read from the shared reference file
   beside the checkout, ``../shared/reference/runs/targets.json``): Llama 3 405B Table 4
   (MFU, BF16 peak) on Meta's 24K RoCE cluster and DeepSeek-V3 (causal MFU and tokens/s
   per GPU) on H800 nodes, published vs predicted.

Run: ``python benchmarks/runs_check.py`` (about four minutes on 2 cores: each refit selects
its terms again inside every held-out fold). Prints Markdown.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an install
from hwspecs.catalog import load_profile, profile_names
from planner import api

#: Beside the checkout, or in a folder above it.
TARGETS = next(
    (up / "shared" / "reference" / "runs" / "targets.json" for up in Path(__file__).resolve().parents[1:]
     if (up / "shared" / "reference" / "runs" / "targets.json").exists()),
    Path(__file__).resolve().parents[2] / "shared" / "reference" / "runs" / "targets.json",
)  # fmt: skip
#: The clusters the targets ran on: Llama 3 §3.3.1 (Meta's 24K-GPU RoCE cluster);
#: DeepSeek-V3 §3.1 (H800 nodes of 8 GPUs on NVLink, InfiniBand between nodes).
TARGET_CLUSTERS = {"h100-sxm": "llama3-h100-24k", "h800-sxm": "dgx-h800"}


def stats_line(name: str, s) -> str:
    return (f"| {name} | {s.n} | {s.mape:.1%} | {s.median_signed_error:+.1%} | "
            f"{s.within_20pct:.0%} |")  # fmt: skip


def main() -> None:
    checks = {label: api.runs_check(profile=choice) for label, choice in
              (("ideal", "none"), ("shipped profiles, in-sample on train rows", None))}  # fmt: skip
    print("#### Published runs: predicted vs measured tokens/s per GPU\n")
    for label, result in checks.items():
        print(f"#### {label} ({result.num_covered} of {result.num_rows} rows covered)\n")
        print("| accelerator | n | MAPE | median | ±20% |\n|---|---|---|---|---|")
        print(stats_line("all", result.overall))
        for s in result.by_accelerator:
            print(stats_line(s.name, s))
        print()
    print("Not covered:", ", ".join(f"{k} ({v})" for k, v in checks["ideal"].uncovered.items()))
    print("\n#### Korthikanti et al. 2022 Table 5 (step time; in the train rows)\n")
    print("| profile | n | step-time MAPE | worst |\n|---|---|---|---|")
    for label, result in checks.items():
        table5 = [r for r in result.rows if r.covered and r.id.startswith("korthikanti22-")]
        errors = {r.id: r.predicted_step_time_s / r.measured_step_time_s - 1 for r in table5}
        worst = max(errors, key=lambda k: abs(errors[k]))
        mape = sum(map(abs, errors.values())) / len(errors)
        print(f"| {label} | {len(errors)} | {mape:.1%} | {worst} {errors[worst]:+.1%} |")
    print("\n#### Profiles refitted on the train catalog\n")
    print("| profile | rows | ideal | in-sample | k-fold | LOSO | worst source (LOSO) |")
    print("|---|---|---|---|---|---|---|")
    for name in profile_names():
        profile = load_profile(name)
        f = api.fit(None, profile.accelerator, profile.stack).fit

        def pct(value):
            return "-" if value is None else f"{value:.1%}"

        by = f["loso_mape_by_source"]
        worst = max(by, key=by.get) if by else "-"
        worst_text = f"{worst} {by[worst]:.1%}" if by else "-"
        print(f"| {name} | {f['num_rows']} | {pct(f['ideal_mape'])} | "
              f"{pct(f['in_sample_mape'])} | {pct(f['kfold_mape'])} | {pct(f['loso_mape'])} | "
              f"{worst_text} |")  # fmt: skip
    print("\n#### Test targets (never fitted on)\n")
    if not TARGETS.exists():
        print(f"(no {TARGETS}: the targets are not shipped)")
        return
    print("| run | published MFU | ideal MFU | profile MFU | published tok/s | ideal | profile "
          "| beyond the profile's runs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    from hwspecs.catalog import load_runs

    definition = {row.id: row.measured.mfu_definition or "" for row in load_runs(str(TARGETS))}
    for accelerator, cluster in TARGET_CLUSTERS.items():
        runs = {"runs": [str(TARGETS)], "accelerator": accelerator, "cluster": cluster}
        ideal = {r.id: r for r in api.runs_check(profile="none", **runs).rows}
        for row in api.runs_check(**runs).rows:
            base = ideal[row.id]
            causal = definition[row.id].startswith("causal")  # the source's own MFU
            key = "predicted_mfu_causal" if causal else "predicted_mfu"
            label = " (causal)" if causal else ""
            print(f"| {row.id} | {row.published_mfu:.1%}{label} | {getattr(base, key):.1%} | "
                  f"{getattr(row, key):.1%} | {row.measured_tokens_per_s_per_gpu:,.0f} | "
                  f"{base.predicted_tokens_per_s_per_gpu:,.0f} | "
                  f"{row.predicted_tokens_per_s_per_gpu:,.0f} | "
                  f"{'; '.join(row.outside_measured_layouts) or '-'} |")  # fmt: skip


if __name__ == "__main__":
    main()

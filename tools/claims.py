"""The paper's claims, read off a regime's grid by the rule docs/results.md §8 fixed before that grid was
complete, as one Markdown table: each comparison with its numbers and its reading.

    python -m tools.claims results/cpu/mix6 [--diagnose docs/diagnose/mix6_grpo_s0/diagnose.json]

The rule. The measure is hint-free greedy success at a run's last step on the held-out games; sampled success
(T = 0.4) is quoted beside it and decides nothing. A comparison is the paired difference over the seeds both
rows have, with its 95 % t interval: *shown* when the interval lies wholly on the side the paper claims,
*reversed* when it lies wholly on the other side, *not shown* when it covers 0. The probe claim is a match:
binary search − Agent-G² is *shown* unless its interval lies wholly above 0 (*reversed*): printed "shown:
no difference found", since it is a failure to find a difference on its seeds, not evidence of none; with the
smallest difference its seeds detect at 80 % power and each row's rollouts a step (mean over its seeds)
beside it. The band (the diagnostic of one checkpoint, eval.py diagnose) is *shown* when its σ is within 0.05
of 0.22 and its R² is at least 0.85.

Two cases the rule leaves open, read here as Table 3 prints them (plumbing/tables.py): a comparison with fewer
seeds than the grid runs (5 for GRPO, 3 for the rest) reads "runs missing"; one with the same difference on
every seed has no spread to size an interval with ("[—]") and reads "no spread". Table 1's hint-free rows
(BASELINES, docs/results.md §11) are read by the same rule, each against the row it claims to beat."""
import argparse
import json

import numpy as np

from plumbing.tables import LABEL, detectable, flat, t_interval
from tools.why import SEEDS_3, SEEDS_A, diffs, load

# (claim, rows compared to Agent-G²) in §8's order; the probe's row is read as binary search − Agent-G²
CLAIMS = [("hints beat plain GRPO", ["grpo"]),
          ("Agent-G² beats the scalar schedules", ["fixed", "linear", "target_acc"]),
          ("Agent-G² matches the probe at a fraction of its rollouts", ["binary"]),
          ("each ablation costs points", ["no_sampling", "uniform", "K1", "no_aux"])]
# Table 1's hint-free rows (docs/results.md §11, written before their runs): (claim, row, the row it beats)
BASELINES = [("GiGPO beats GRPO", "gigpo", "grpo"), ("BEACON beats GRPO", "beacon", "grpo"),
             ("GiGPO's advantage adds to Agent-G²", "g2_gigpo", "g2"),
             ("RLVMR beats GRPO from its cold start", "rlvmr", "grpo_cold")]  # §12


def compare(a, b, seeds, sampled=False):
    """a - b over the seeds both have: (mean, lo, hi, paired differences) of the final evaluations."""
    d = diffs(a, b, seeds, sampled=sampled)[1]
    m, h = t_interval(d)
    return m, m - h, m + h, d


def interval(m, lo, hi, d):
    pts = lambda x: f"{round(x, 9) + 0.0:+.1f}"  # noqa: E731  (no "-0.0" from float noise)
    if not d:
        return "no runs yet"
    if len(d) < 2 or flat(d):
        return f"{pts(m)} (1 seed)" if len(d) == 1 else f"{pts(m)} [—] ({len(d)} seeds)"
    return f"{pts(m)} [{pts(lo)}, {pts(hi)}] ({len(d)} seeds)"


def claims(runs, diag=None):
    """runs: {method: {seed: summary}} (tools.why.load); diag: a diagnose.json, or None -> Markdown lines."""
    g2 = runs.get("g2", {})
    out = ["| claim | comparison | greedy, points (95 % paired t interval) | reading | beside it (decides "
           "nothing) |", "|---|---|---|---|---|"]
    for claim, others in CLAIMS:
        for i, name in enumerate(others):
            other, want = runs.get(name, {}), SEEDS_A if name == "grpo" else SEEDS_3
            probe = name == "binary"
            a, b = (other, g2) if probe else (g2, other)
            m, lo, hi, d = compare(a, b, want)
            s = compare(a, b, want, sampled=True)
            if len(d) < len(want):
                reading = f"runs missing ({len(d)} of {len(want)} seeds)"
            elif flat(d):
                reading = "no spread"
            elif probe:
                reading = "**reversed**" if lo > 0 else "**shown**: no difference found"  # not a proof of one
            else:
                reading = "**shown**" if lo > 0 else "**reversed**" if hi < 0 else "**not shown**"
            beside = f"sampled {interval(*s)}"
            if probe and len(d) > 1 and not flat(d):
                r = [np.mean([x["rollouts_per_step"] for x in r.values()]) for r in (g2, other)]
                smallest = detectable(float(np.std(d, ddof=1)), len(d))
                beside += (f"; detectable {smallest:.1f}; rollouts a step {r[0]:.1f} against {r[1]:.1f} "
                           f"({r[0] / r[1]:.2f}×)")
            pair = f"{LABEL[name]} − Agent-G²" if probe else f"Agent-G² − {LABEL[name]}"
            out.append(f"| {claim if i == 0 else ''} | {pair} | {interval(m, lo, hi, d)} | {reading} | "
                       f"{beside} |")
    for claim, name, base in BASELINES:
        a, b = runs.get(name, {}), runs.get(base, {})
        m, lo, hi, d = compare(a, b, SEEDS_3)
        reading = (f"runs missing ({len(d)} of {len(SEEDS_3)} seeds)" if len(d) < len(SEEDS_3) else
                   "no spread" if flat(d) else
                   "**shown**" if lo > 0 else "**reversed**" if hi < 0 else "**not shown**")
        out.append(f"| {claim} | {LABEL[name]} − {LABEL[base]} | {interval(m, lo, hi, d)} | {reading} | "
                   f"sampled {interval(*compare(a, b, SEEDS_3, sampled=True))} |")
    if diag is None:
        out.append("| the band: σ ≈ 0.22, R² ≈ 0.9 | the diagnostic | no diagnostic given | | |")
    else:
        sigma, r2 = diag["fit"]["sigma"], diag["fit"]["r2"]
        # rounded: 0.27 - 0.22 is 0.05000000000000002 in floats, and 0.27 lies within 0.05
        shown = round(abs(sigma - 0.22), 9) <= 0.05 and r2 >= 0.85
        out.append(f"| the band: σ ≈ 0.22, R² ≈ 0.9 | the diagnostic of {diag['checkpoint']} | "
                   f"σ {sigma:.3f}, R² {r2:.3f} | **{'shown' if shown else 'not shown'}** | |")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", help="a regime's results folder: <method>/s<seed>/summary.json")
    p.add_argument("--diagnose", help="the diagnose.json the band claim is read from")
    a = p.parse_args(argv)
    print("\n".join(claims(load(a.results), json.load(open(a.diagnose)) if a.diagnose else None)))


if __name__ == "__main__":
    main()

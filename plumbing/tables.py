"""The paper's tables for a regime with held-out games (config/cpu_mix6.py: its evaluations play the splits
test_seen and test_unseen), from the kept summaries: `python eval.py table results/cpu/mix6` prints them
(report.table hands every setting whose runs evaluated on test_* splits to regime_tables).

- Table 1's shape: hint-free success on the held-out games per task type, seen / unseen rooms and overall,
  greedy and sampled, mean ± std over seeds; beside the overall column a 95 % t interval of the mean over
  seeds (seed-to-seed spread; with 3 seeds a percentile bootstrap would only give the seeds' min and max) and
  a 95 % Wilson interval of the games pooled over the seeds (binomial noise only).
- Table 2's shape: seconds and rollouts per step (probe rollouts included), as ratios to GRPO's.
- Table 3's shape: each method's difference from Agent-G² on the same seeds (paired), with a 95 % t interval,
  and the smallest paired difference those seeds could detect at 80 % power; then Agent-G² against GRPO
  (unpaired, each row's seeds).
The cells' statistics live here too (wilson, mean_std: report.table's cells as well).
"""
import math

import numpy as np

HELD = ("test_seen", "test_unseen")
SHORT_TYPES = ("pick_and_place_simple", "look_at_obj_in_light")  # ALFWorld's short types; the rest: long
TYPE_LABEL = {"pick_and_place_simple": "Pick", "look_at_obj_in_light": "Look",
              "pick_clean_then_place_in_recep": "Clean", "pick_heat_then_place_in_recep": "Heat",
              "pick_cool_then_place_in_recep": "Cool", "pick_two_obj_and_place": "Pick Two"}
LABEL = {"g2": "Agent-G²", "grpo": "GRPO", "fixed": "fixed ratio 0.5", "linear": "linear decay",
         "target_acc": "target-acc", "binary": "binary search (probe)", "no_sampling": "σ = 0 (no sampling)",
         "uniform": "uniform sampling", "K1": "K = 1", "no_aux": "η = 0 (no aux loss)", "gigpo": "GiGPO",
         "beacon": "BEACON", "beacon_readme": "BEACON (README's γ, λ)", "g2_gigpo": "Agent-G² + GiGPO",
         "base": "SFT base (step 0)", "hint_free": "Agent-G², half hint-free", "aux_only": "L_aux alone",
         "g2_300": "Agent-G², 300 steps", "grpo_300": "GRPO, 300 steps", "rlvmr": "RLVMR",
         "rlvmr_cold": "RLVMR's cold start (SFT)", "grpo_cold": "GRPO from RLVMR's cold start"}


def wilson(k, n, z=1.96):
    """95 % Wilson score interval of k successes in n trials -> (lo, hi)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, c - h), min(1.0, c + h))


def mean_std(v):
    """A table cell: mean ± std over seeds, the sample std (ddof 1: the seeds are a sample of the seeds one
    could run), NaNs dropped; one seed shows its value (it has no std)."""
    v = [x for x in v if x == x]
    if not v:
        return ""
    if len(v) == 1:
        return f"{v[0]:.1f}"
    return f"{np.mean(v):.1f} ± {np.std(v, ddof=1):.1f}"


def base_rows(rows):
    """The SFT base as a row like the others: each seed's evaluation at step 0 (one run per seed; every
    method's run of a seed evaluates the same base on the same stream), as summaries whose "final" it is.
    Greedy gives the same on every seed; sampled draws with each seed's stream, as the trained rows do."""
    firsts = {}
    for rs in rows.values():
        for s in rs:
            if s.get("evals") and s["evals"][0]["step"] == 0:
                firsts.setdefault(s["cfg"]["seed"], {"final": s["evals"][0]["eval"], "cfg": s["cfg"]})
    return [firsts[k] for k in sorted(firsts)]


def t_quantile(p, df):
    """Student's t quantile: the x with P(T <= x) = p for df degrees of freedom (p >= 0.5), from the density
    integrated by Simpson's rule and bisection (no scipy here)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x):  # 0.5 + the integral of the density over [0, x]
        u = np.linspace(0.0, x, 2001)
        f = c * (1 + u * u / df) ** (-(df + 1) / 2)
        return 0.5 + (u[1] - u[0]) / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def seed_interval(values):
    """The 95 % t interval of the mean of `values` (one per seed) as 'lo–hi'; one seed: '—'."""
    m, h = t_interval(values)
    return f"{m - h:.1f}–{m + h:.1f}" if h == h else "—"


def t_interval(d):
    """(mean, half width) of a 95 % t interval of the mean of d (paired differences, one per seed)."""
    d = np.asarray(d, float)
    if len(d) < 2:
        return float(d.mean()) if len(d) else float("nan"), float("nan")
    return float(d.mean()), t_quantile(0.975, len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d))


def flat(d):
    """True when every seed gives one paired difference (success moves in steps of 1 / games): no spread to
    size a t interval or a detectable difference with."""
    return len(d) > 1 and max(d) - min(d) < 1e-9


def detectable(sd, n1, n2=None, power=0.8):
    """The smallest true difference a two-sided 5 % t test detects with probability `power`, for a spread sd
    (the std of the paired differences, or the pooled std of two groups) over n1 seeds (paired) or n1 and n2
    (two groups): (t_0.975 + t_power) sd sqrt(1/n), or sd sqrt(1/n1 + 1/n2), at the test's degrees of
    freedom."""
    df, scale = (n1 - 1, 1 / math.sqrt(n1)) if n2 is None else (n1 + n2 - 2, math.sqrt(1 / n1 + 1 / n2))
    if df < 1 or not sd == sd:
        return float("nan")
    return (t_quantile(0.975, df) + t_quantile(power, df)) * sd * scale


def held_counts(ev, sampled):
    """{task type, 'seen', 'unseen', 'all': (won, games)} of one evaluation (a summary's "final", or the
    "eval" of an entry of its "evals") on the held-out splits."""
    out = {}
    for split in HELD:
        c = ev["counts"][split + ("_sampled" if sampled else "")]
        pairs = (list(c["per_type"].items()) + [(split[5:], (c["won"], c["n"])), ("all", (c["won"], c["n"]))]
                 + [("short" if t in SHORT_TYPES else "long", x) for t, x in c["per_type"].items()])
        for key, (won, n) in pairs:
            w, m = out.get(key, (0, 0))
            out[key] = (w + won, m + n)
    return out


def grpo_cost(rows):
    """GRPO's mean seconds and rollouts per step (NaN without a GRPO row): what Table 2's ratios divide by."""
    return {k: np.mean([s[k] for s in rows["grpo"]]) if "grpo" in rows else float("nan")
            for k in ("s_per_step", "rollouts_per_step")}


def brief_table(rows, pct):
    """One row per method: overall held-out success greedy and sampled (mean ± std over seeds, [the 95 % t
    interval over seeds]), greedy on the short (Pick, Look) and the long types, cost as ratios to GRPO's."""
    def cell(rs, key, sampled):
        v = [pct(s, key, sampled) for s in rs]
        return f"{mean_std(v)} [{seed_interval(v)}]"
    greedy = lambda rs, key: mean_std([pct(s, key, False) for s in rs  # noqa: E731
                                  if key in held_counts(s["final"], False)])
    grpo = grpo_cost(rows)
    out = ["| method | seeds | greedy | sampled (T = 0.4) | greedy, short types | greedy, long types | "
           "s/step × GRPO | rollouts × GRPO |", "|---|---|---|---|---|---|---|---|"]
    base = base_rows(rows)  # the base's row has no training cost
    for name, rs in (({"base": base} if base else {}) | rows).items():
        cost = " | |" if name == "base" else "".join(
            f" {np.mean([s[k] for s in rs]) / grpo[k]:.2f} |" for k in ("s_per_step", "rollouts_per_step"))
        out.append(f"| {LABEL.get(name, name)} | {len(rs)} | {cell(rs, 'all', False)} | "
                   f"{cell(rs, 'all', True)} | {greedy(rs, 'short')} | {greedy(rs, 'long')} |" + cost)
    return out


def regime_tables(rows, brief=False):
    """rows: {method name: [run summaries, one per seed]} of one setting -> the Markdown of Tables 1-3 (brief:
    brief_table's one table)."""
    types = [t for t in TYPE_LABEL if any(t in held_counts(s["final"], False)
                                     for rs in rows.values() for s in rs)]
    cols = types + ["seen", "unseen", "all"]
    pct = lambda s, key, sampled: (  # noqa: E731
        100 * (lambda w, n: w / n)(*held_counts(s["final"], sampled)[key]))
    if brief:
        return "\n".join(["Hint-free success (%) on the held-out games, mean ± std over seeds [95 % t "
                          "interval over seeds]", ""] + brief_table(rows, pct))
    seeds = {n: {s["cfg"]["seed"]: s for s in rs} for n, rs in rows.items()}
    base = base_rows(rows)  # the base, evaluated as the rows are: one step-0 evaluation per seed
    out = []
    for sampled in (False, True):
        out.append(f"\n*Table 1 ({'sampled at T = 0.4' if sampled else 'greedy'}): hint-free success (%) on "
                   "the held-out games, mean ± std over seeds*\n")
        out.append("| method | seeds | " + " | ".join(TYPE_LABEL.get(c, c) for c in cols) +
                   " | all: 95 % t over seeds | all: 95 % over games (Wilson) |")
        out.append("|---|---|" + "---|" * (len(cols) + 2))
        for name, rs in (({"base": base} if base else {}) | rows).items():
            cells = [mean_std([pct(s, c, sampled) for s in rs if c in held_counts(s["final"], sampled)])
                     for c in cols]
            won, n = (sum(held_counts(s["final"], sampled)["all"][i] for s in rs) for i in (0, 1))
            wl, wh = wilson(won, n)
            out.append(f"| {LABEL.get(name, name)} | {len(rs)} | " + " | ".join(cells) +
                       f" | {seed_interval([pct(s, 'all', sampled) for s in rs])} | "
                       f"{100 * wl:.1f}–{100 * wh:.1f} ({won} / {n}) |")
    if "grpo" in rows:
        base = grpo_cost(rows)
        out.append("\n*Table 2: cost per training step, as ratios to GRPO's (rollouts include the "
                   "probes'); a run's wall time includes its evaluations*\n")
        out.append("| method | seeds | s/step | × GRPO | rollouts/step | × GRPO | wall min / run | wall min, "
                   "seed by seed |")
        out.append("|---|---|---|---|---|---|---|---|")
        for name, rs in rows.items():
            s_, r_ = ([s[k] for s in rs] for k in ("s_per_step", "rollouts_per_step"))
            wall = {k: s["wall_s"] / 60 for k, s in sorted(seeds[name].items()) if s.get("wall_s")}  # min
            out.append(f"| {LABEL.get(name, name)} | {len(rs)} | {mean_std(s_)} | "
                       f"{np.mean(s_) / base['s_per_step']:.2f} | {mean_std(r_)} | "
                       f"{np.mean(r_) / base['rollouts_per_step']:.2f} | {mean_std(list(wall.values()))} | "
                       + ", ".join(f"s{k} {m:.1f}" for k, m in wall.items()) + " |")
        walls = [s["wall_s"] for rs in rows.values() for s in rs if s.get("wall_s")]
        out.append(f"\nWall time: {len(walls)} runs, {sum(walls) / 3600:.1f} h in all.")
    if "g2" in rows:
        out.append("\n*Table 3: difference from Agent-G² on the same seeds (points of overall held-out "
                   "success; 95 % t interval of the paired differences; detectable: the smallest paired "
                   "difference these seeds detect at 80 % power, two-sided 5 %; —: one paired seed, or the "
                   "same difference on every seed, which leaves no spread to size them with)*\n")
        out.append("| method | paired seeds | Δ greedy | detectable | Δ sampled | detectable |")
        out.append("|---|---|---|---|---|---|")
        for name in [n for n in rows if n != "g2"]:
            common = sorted(set(seeds[name]) & set(seeds["g2"]))
            cells = []
            for sampled in (False, True):
                d = [pct(seeds[name][k], "all", sampled) - pct(seeds["g2"][k], "all", sampled)
                     for k in common]
                m, h = t_interval(d)
                # one paired seed, or one difference on every seed (success moves in steps of 1 / 144):
                # no spread to size an interval or a detectable difference with
                if len(d) < 2 or flat(d):
                    cells += [f"{m:+.1f} [—]", "—"]
                    continue
                cells += [f"{m:+.1f} [{m - h:+.1f}, {m + h:+.1f}]",
                          f"{detectable(float(np.std(d, ddof=1)), len(d)):.1f}"]
            out.append(f"| {LABEL.get(name, name)} | {len(common)} | " + " | ".join(cells) + " |")
    if "g2" in rows and "grpo" in rows:
        parts = []
        for sampled in (False, True):
            a, b = ([pct(s, "all", sampled) for s in rows[n]] for n in ("g2", "grpo"))
            sd = math.sqrt(((len(a) - 1) * np.var(a, ddof=1) + (len(b) - 1) * np.var(b, ddof=1))
                           / max(len(a) + len(b) - 2, 1)) if min(len(a), len(b)) > 1 else float("nan")
            m, h = np.mean(a) - np.mean(b), detectable(sd, len(a), len(b))
            spread = ("one seed a side: no spread yet" if math.isnan(sd) else
                      "every seed the same: no spread yet" if sd < 1e-9 else
                      f"pooled seed std {sd:.1f}; detectable at 80 % power: {h:.1f}")
            parts.append(f"{'sampled' if sampled else 'greedy'} {m:+.1f} points ({spread})")
        out.append(f"\nAgent-G² − GRPO, {len(rows['g2'])} and {len(rows['grpo'])} seeds (unpaired): "
                   + "; ".join(parts) + ".")
    return "\n".join(out)

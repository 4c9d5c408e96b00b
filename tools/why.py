"""The verdicts of docs/results.md §9 (why the hints do not transfer in the mixed regime), read from the kept
summaries by the rules §9 wrote down before its runs: each explanation's numbers, interval and verdict
(supported / refuted / undecided), as Markdown.

    python -m tools.why [--pre results/cpu/mix6_cc749d5] [--post results/cpu/mix6] [--why results/cpu/why]
    python -m tools.why --brief

--brief (the README's lines) prints the verdicts with their deciding numbers only. Otherwise, after the
verdicts, every run of §9 (the grid's reruns and the --only why runs; the kept rows of an earlier commit are
not §9's) with its commit, start (its summary's date less its wall time) and wall time, and the total.

Greedy hint-free success at a run's last step on the held-out games (all 144, or the 72 of test_seen);
comparisons paired by seed with a 95 % t interval (plumbing/tables.t_interval). A verdict whose runs are not
all in yet prints "runs missing" and the seeds it has."""
import argparse
import glob
import json
import os

import numpy as np

from plumbing.tables import held_counts, t_interval

SEEDS_A, SEEDS_3 = (0, 1, 2, 3, 4), (0, 1, 2)
HINTED = ("g2", "fixed", "linear", "target_acc", "binary", "no_sampling", "uniform", "K1")


def load(root):
    """{method: {seed: summary (with "grad_norm": the mean over its logged steps)}} of a results folder."""
    out = {}
    for f in sorted(glob.glob(os.path.join(root, "*", "s*", "summary.json"))):
        s = json.load(open(f))
        log = os.path.join(os.path.dirname(f), "log.jsonl")
        steps = [r for r in map(json.loads, open(log)) if "eval" not in r] if os.path.exists(log) else []
        s["grad_norm"] = float(np.mean([r["grad_norm"] for r in steps])) if steps else float("nan")
        out.setdefault(os.path.basename(os.path.dirname(os.path.dirname(f))), {})[s["cfg"]["seed"]] = s
    return out


def pct(ev, key="all", split=None, sampled=False):
    """Greedy success (%) of one evaluation (sampled: its pass at T = 0.4): the held-out games ("all" / "seen"
    / "unseen"), or a split of its own (split="train_panel")."""
    if split:
        c = ev["counts"][split]
        return 100.0 * c["won"] / c["n"]
    won, n = held_counts(ev, sampled)[key]
    return 100.0 * won / n


def diffs(a, b, seeds, key="all", sampled=False):
    """a - b (final evaluations, points) over the seeds both have -> (seeds used, paired differences)."""
    common = [k for k in seeds if k in a and k in b]
    return common, [pct(a[k]["final"], key, sampled=sampled) - pct(b[k]["final"], key, sampled=sampled)
                    for k in common]


def paired(a, b, seeds, key="all"):
    """Paired differences a - b (final evaluations) over the seeds both have -> (mean, lo, hi, seeds used)."""
    common, d = diffs(a, b, seeds, key)
    m, h = t_interval(d)
    return m, m - h, m + h, common


def fmt(m, lo, hi, seeds):
    if len(seeds) < 2:  # one seed has no interval
        return f"{m:+.1f} (1 seed)" if seeds else "no runs yet"
    return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}] ({len(seeds)} seeds)"


def verdicts(pre, post, why):
    """-> [(explanation, numbers, more numbers that decide nothing, verdict)] by §9's rules."""
    out = []
    g2 = post.get("g2", {})
    # (a) post - pre Agent-G², 5 paired seeds: above 0 supported; upper end < +2.6 refuted
    m, lo, hi, s = paired(g2, pre.get("g2", {}), SEEDS_A)
    v = ("runs missing" if len(s) < len(SEEDS_A) else "supported" if lo > 0 else
         "refuted" if hi < 2.6 else "undecided")
    gn = {k: float(np.mean([r["grad_norm"] for r in d[name].values()])) if d.get(name) else float("nan")
          for k, d, name in (("after", post, "g2"), ("before", pre, "g2"), ("eta 0", post, "no_aux"))}
    rows = "; ".join(f"{n} {fmt(*paired(post.get(n, {}), pre.get(n, {}), SEEDS_3))}" for n in HINTED[1:])
    out.append(("(a) L_aux on the wrong distribution", f"Agent-G² after − before {fmt(m, lo, hi, s)}",
                f"mean grad norm after {gn['after']:.3f}, before {gn['before']:.3f}, "
                f"η = 0 {gn['eta 0']:.3f}; "
                f"the other hinted rows, after − before: {rows}", v))
    # (b) hint_free - Agent-G² on seen rooms, seeds 0-2, against G = GRPO - Agent-G² (seen)
    G = paired(post.get("grpo", {}), g2, SEEDS_3, "seen")
    hf = why.get("hint_free", {})
    m, lo, hi, s = paired(hf, g2, SEEDS_3, "seen")
    mean_hf = np.mean([pct(hf[k]["final"], "seen") for k in s]) if s else float("nan")
    mean_g2 = np.mean([pct(g2[k]["final"], "seen") for k in s]) if s else float("nan")
    v = ("runs missing" if len(s) < 3 or len(G[3]) < 3 else
         "undecided (no gap on seen rooms)" if G[0] <= 0 else
         "supported" if lo > 0 and mean_hf >= mean_g2 + G[0] / 2 else "refuted" if m <= 0 else "undecided")
    if v == "refuted" and hi >= G[0] / 2:  # the rule reads the mean; the interval says how little it tells
        v = f"refuted by the rule's mean, though its interval holds the predicted +{G[0] / 2:.1f}"
    out.append(("(b) the search phase is never practised",
                f"seen rooms: GRPO − Agent-G² G = {G[0]:+.1f}; hint_free − Agent-G² {fmt(m, lo, hi, s)}; "
                f"hint_free {mean_hf:.1f} %, Agent-G² {mean_g2:.1f} %", "", v))
    # (c) L_aux alone: train panel up and held-out down from step 0 to the end
    ao = why.get("aux_only", {})
    seeds = [k for k in SEEDS_3 if k in ao]
    first = lambda s: next(e["eval"] for e in s["evals"] if e["step"] == 0)  # noqa: E731
    dt = [pct(ao[k]["final"], split="train_panel") - pct(first(ao[k]), split="train_panel") for k in seeds]
    dh = [pct(ao[k]["final"]) - pct(first(ao[k])) for k in seeds]
    (mt, ht), (mh, hh) = t_interval(dt), t_interval(dh)
    v = ("runs missing" if len(seeds) < 3 else "supported" if mt - ht > 0 and mh + hh < 0 else
         "refuted" if mt <= 0 or mh >= 0 else "undecided")
    out.append(("(c) L_aux memorises the training games", f"L_aux alone, step 0 → end: training panel "
                f"{fmt(mt, mt - ht, mt + ht, seeds)}, held-out {fmt(mh, mh - hh, mh + hh, seeds)}", "", v))
    # (d) the ordering at 300 steps against the sign at 150
    s150 = paired(g2, post.get("grpo", {}), SEEDS_3)
    m, lo, hi, s = paired(why.get("g2_300", {}), why.get("grpo_300", {}), SEEDS_3)
    sign = np.sign(s150[0])
    v = ("runs missing" if len(s) < 3 or len(s150[3]) < 3 else "undecided" if sign == 0 else
         "supported" if (lo > 0 if sign < 0 else hi < 0) else
         "refuted" if (hi < 0 if sign < 0 else lo > 0) else "undecided")
    out.append(("(d) too little learning", f"Agent-G² − GRPO at 150 steps {fmt(*s150)}; at 300 steps "
                f"{fmt(m, lo, hi, s)}", "", v))
    return out


def runs_table(post, why, kept="cc749d5"):
    """Markdown lines: each of §9's runs (post's hinted rows not at the kept rows' commit, and why's), oldest
    start first: folder, commit, start (UTC), wall minutes; then the total wall time. A summary's date has
    minute precision, so a run started within the minute after the start shown. A resumed run (its config's
    --resume set) is marked: its wall time counts each process up to its last checkpoint, so it began before
    the start shown."""
    import datetime
    rows = []
    for folder, runs in (("mix6", post), ("why", why)):
        for method, by_seed in sorted(runs.items()):
            for seed, s in sorted(by_seed.items()):  # mix6's: §9's reruns of the hinted rows only
                hinted = folder == "why" or method in HINTED
                if s.get("git_commit") == kept or "date" not in s or not hinted:
                    continue
                end = datetime.datetime.strptime(s["date"], "%Y-%m-%d %H:%M UTC")
                start = end - datetime.timedelta(seconds=s["wall_s"])
                resumed = " (resumed: began earlier)" if s.get("cfg", {}).get("resume") else ""
                cells = [f"{folder}/{method}/s{seed}", s["git_commit"], f"{start:%Y-%m-%d %H:%M:%S}{resumed}",
                         f"{s['wall_s'] / 60:.1f}"]
                rows.append((start, "| " + " | ".join(cells) + " |", s["wall_s"]))
    rows.sort(key=lambda r: r[0])
    return (["| run | commit | start (UTC, within a minute after) | wall (min) |", "|---|---|---|---:|"]
            + [r[1] for r in rows]
            + [f"| all {len(rows)} runs | | | {sum(r[2] for r in rows) / 60:.1f} |"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pre", default="results/cpu/mix6_cc749d5")
    p.add_argument("--post", default="results/cpu/mix6")
    p.add_argument("--why", default="results/cpu/why")
    p.add_argument("--brief", action="store_true",
                   help="the verdicts and their deciding numbers only (the README's lines)")
    a = p.parse_args(argv)
    rows = verdicts(load(a.pre), load(a.post), load(a.why))
    print("| explanation | numbers (points of greedy held-out success; 95 % paired t interval) | verdict |")
    print("|---|---|---|")
    for name, nums, more, v in rows:
        more = "; " + more if more and not a.brief else ""
        print(f"| {name} | {nums}{more} | **{v}** |")
    if not a.brief:
        print("\n" + "\n".join(runs_table(load(a.post), load(a.why))))


if __name__ == "__main__":
    main()

"""The paper's diagnostic protocol (method §6, `python eval.py diagnose`): for a checkpoint, success p_i(d)
of each sampled task at every depth of a grid, d*_i, the aligned information profile p(1 - p) against d - d*_i
with its Gaussian fit, and a replay of every scheduler on the measured curves (where each puts its groups, at
what cost).

    python eval.py diagnose --model CKPT [--tasks 8] [--rollouts 32] [--grid 0.1] [--checkpoints RUN_DIR]
"""
import collections
import dataclasses
import json
import os

import numpy as np

from rollout import ExpertSource, Reply, group, rollout


def measure_curves(engine, pool, tok, tasks, cfg, grid, R, seed=0, chunk=64):
    """p_i(d) for every task and every depth ratio d of the grid, from R rollouts each (n = prefix_len(d, L);
    grid points that give the same n share one group). -> {task id: {"L", "type", "d": [...], "n": [...], "p":
    [...]}}"""
    from tqdm import tqdm
    from scheduler import prefix_len
    source, reply = ExpertSource(tasks), Reply(cfg)  # the expert trajectories the curves follow
    pairs = sorted({(i, prefix_len(d, t["L"])) for i, t in enumerate(tasks) for d in grid})
    print(f"[diagnose] {len(tasks)} tasks x {len(grid)} depths -> {len(pairs)} groups x R={R} = "
          f"{len(pairs) * R} rollouts (temperature {cfg.temperature})")
    succ = {}
    per = max(1, chunk // R)
    for j in tqdm(range(0, len(pairs), per), desc="diagnose", unit="batch"):
        part = pairs[j:j + per]
        out = rollout(engine, pool, tok, [group(tasks[i], source.hint(tasks[i]), n, R) for i, n in part], cfg,
                      seed + j, reply)
        for g, pr in enumerate(part):
            eps = [e for e in out["episodes"] if e["gid"] == g and not e["error"]]
            succ[pr] = sum(e["won"] for e in eps) / max(len(eps), 1)
    return {t["id"]: {"L": t["L"], "type": t["task_type"], "d": list(grid),
                      "n": [prefix_len(d, t["L"]) for d in grid],
                      "p": [succ[(i, prefix_len(d, t["L"]))] for d in grid]} for i, t in enumerate(tasks)}


def d_star(c):
    """The depth of the grid whose success is closest to 0.5 (ties: the shallower)."""
    return min(zip(c["d"], c["p"]), key=lambda x: (abs(x[1] - 0.5), x[0]))[0]


def aligned_profile(curves, width=0.1):
    """Align every (task, depth) pair on dd = d - d*_i, bin dd by `width`, average p(1-p) per bin.
    -> (bin centres [m], mean p(1-p) [m], pairs per bin [m])"""
    bins = collections.defaultdict(list)
    for c in curves.values():
        ds = d_star(c)
        for d, p in zip(c["d"], c["p"]):
            bins[round((d - ds) / width)].append(p * (1 - p))
    ks = sorted(bins)
    return (np.array([k * width for k in ks]), np.array([np.mean(bins[k]) for k in ks]),
            np.array([len(bins[k]) for k in ks]))


def fit_gaussian(x, y):
    """Least squares a * exp(-x^2 / (2 sigma^2)): for each sigma the best a is closed-form; sigma by a fine
    grid search then a local refinement. -> (a, sigma, R^2)"""
    x, y = np.asarray(x, float), np.asarray(y, float)

    def best(s):
        g = np.exp(-x ** 2 / (2 * s * s))
        a = float(g @ y / max(g @ g, 1e-30))
        return float(((y - a * g) ** 2).sum()), a
    grid = np.linspace(0.005, 2.0, 4000)
    s0 = grid[int(np.argmin([best(s)[0] for s in grid]))]
    fine = np.linspace(max(s0 - 0.001, 1e-4), s0 + 0.001, 201)
    s = fine[int(np.argmin([best(v)[0] for v in fine]))]
    sse, a = best(s)
    sst = float(((y - y.mean()) ** 2).sum())
    return a, float(s), 1 - sse / sst if sst > 0 else float("nan")


def band_of(p, lo=0.4, hi=0.6):
    return "under" if p < lo else "over" if p > hi else "in"


def replay(curves, cfg, train_tasks, rules, step=0, sched_state=None, draws=50, seed=0):
    """Each scheduler's rule picks a depth for every measured task, as in training (scheduler.make_rule),
    and probe methods probe the measured curves (R Bernoulli draws at the measured p). A task group lands
    under, in or over the band by the measured p at the chosen depth (nearest measured depth). rules: [(label,
    overrides)]; the label "Agent-G2 (checkpoint state)" loads sched_state. -> {label: {"under", "in", "over",
    "rollouts_per_R"}}"""
    from scheduler import make_rule
    from variants.rules import is_g2
    ids = list(curves)
    tasks = [{"id": t, "L": curves[t]["L"]} for t in ids]
    rng = np.random.default_rng(seed)
    R = cfg.group_size

    def p_at(i, n):  # measured success at the nearest measured prefix length
        c = curves[ids[i]]
        j = int(np.argmin([abs(m - n) for m in c["n"]]))
        return c["p"][j]
    out = {}
    for label, ov in rules:
        # {} = the run's Agent-G²-family rule, its settings
        base = cfg.scheduler if is_g2(cfg.scheduler) else "g2"
        c = dataclasses.replace(cfg, **{"scheduler": base, **ov})
        counts, rollouts = collections.Counter(), 0
        for k in range(draws):
            s = make_rule(c, [t["id"] for t in train_tasks], [t["L"] for t in train_tasks], seed + k)
            if sched_state is not None and label.endswith("(checkpoint state)"):
                s.load_state_dict(sched_state)
                s.rng = np.random.default_rng(seed + k)
            plan = s.depths(tasks, step, lambda pairs: [int(rng.binomial(R, p_at(i, n))) for i, n in pairs])
            counts.update(band_of(p_at(i, n)) for i, n in enumerate(plan["n"]))
            rollouts += len(tasks) * R + plan["probe_rollouts"]
        tot = sum(counts.values())
        out[label] = {"under": counts["under"] / tot, "in": counts["in"] / tot, "over": counts["over"] / tot,
                      "rollouts_per_R": rollouts / (draws * len(tasks) * R)}
    return out


def diagnose_plots(curves, prof, fit, rep, budget, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x, y, _ = prof
    a, sigma, r2 = fit
    fig, ax = plt.subplots(figsize=(6, 4))  # Figure 3a: example curves with the band
    for tid in list(curves)[:6]:
        c = curves[tid]
        ax.plot(c["d"], c["p"], marker="o", ms=3, label=f"{c['type'][:18]} L={c['L']}")
    ax.axhspan(0.4, 0.6, color="green", alpha=0.15, label="band [0.4, 0.6]")
    ax.set(xlabel="depth ratio d", ylabel="success p_i(d)", title="success against guidance depth (examples)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "fig3a_curves.png"), dpi=100)
    fig, ax = plt.subplots(figsize=(6, 4))  # Figure 3b: aligned profile + fit
    ax.bar(x, y, width=0.08, alpha=0.6, label="mean p(1-p) per bin")
    xs = np.linspace(x.min(), x.max(), 200)
    ax.plot(xs, a * np.exp(-xs ** 2 / (2 * sigma ** 2)), "r-", label=f"fit sigma={sigma:.3f}, R2={r2:.2f}")
    ax.set(xlabel="d - d*_i", ylabel="p(1-p)", title="aligned information profile")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "fig3b_profile.png"), dpi=100)
    fig, ax = plt.subplots(figsize=(8, 4))  # Figure 2a: under / in / over per scheduler
    labels = list(rep)
    bottom = np.zeros(len(labels))
    for part, col in (("under", "tab:blue"), ("in", "tab:green"), ("over", "tab:red")):
        v = np.array([100 * rep[k][part] for k in labels])
        ax.bar(range(len(labels)), v, bottom=bottom, color=col, label=part)
        bottom += v
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="% of task groups", title="where each scheduler puts the groups (measured curves)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "fig2a_mismatch.png"), dpi=100)
    fig, ax = plt.subplots(figsize=(6, 4))  # Figure 2b: mismatch against rollout budget
    for k, v in budget.items():
        ax.scatter(v["rollouts_per_R"], 100 * (1 - v["in"]))
        ax.annotate(k, (v["rollouts_per_R"], 100 * (1 - v["in"])), fontsize=7)
    ax.set(xscale="log", xlabel="rollouts per task / R (1 = GRPO)", ylabel="mismatch % (outside the band)",
           title="mismatch against rollout budget (measured curves)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "fig2b_budget.png"), dpi=100)
    plt.close("all")


def diagnose(engine, pool, tok, tasks, train_tasks, cfg, args, ckpt):
    """docs/method.md §6 on one checkpoint: curves, d*, aligned profile + Gaussian fit, scheduler replay;
    JSON + PNGs."""
    from config import BUDGET, flag_values, scheduler_methods
    from variants.rules import is_g2
    grid = [round(x, 4) for x in np.arange(0, 1 + 1e-9, args.grid)]
    c = dataclasses.replace(cfg, group_size=args.rollouts)
    curves = measure_curves(engine, pool, tok, tasks, c, grid, args.rollouts, seed=cfg.seed)
    prof = aligned_profile(curves, args.grid)
    fit = fit_gaussian(prof[0], prof[1])
    st_path = os.path.join(ckpt, "state.json")
    st = json.load(open(st_path)) if os.path.exists(st_path) else {}
    step = st.get("step", 0)
    state = st.get("state", {}).get("sched")  # the run's scheduler at this checkpoint
    rules = scheduler_methods() + ([("Agent-G2 (checkpoint state)", {})]
                                   if state and is_g2(cfg.scheduler) else [])
    rep = replay(curves, cfg, train_tasks, rules, step, state, args.draws, cfg.seed)
    budget = replay(curves, cfg, train_tasks, [(k, flag_values(v)) for k, v in BUDGET.items()], step, None,
                    args.draws, cfg.seed)
    os.makedirs(args.out, exist_ok=True)
    res = {"checkpoint": ckpt, "step": step, "grid": grid, "rollouts": args.rollouts, "curves": curves,
           "d_star": {t: d_star(cv) for t, cv in curves.items()},
           "profile": {"dd": prof[0].tolist(), "pq": prof[1].tolist(), "pairs": prof[2].tolist()},
           "fit": {"a": fit[0], "sigma": fit[1], "r2": fit[2]}, "replay": rep, "budget": budget}
    json.dump(res, open(os.path.join(args.out, "diagnose.json"), "w"), indent=1)
    diagnose_plots(curves, prof, fit, rep, budget, args.out)
    print(f"[diagnose] {ckpt} (step {step}): sigma {fit[1]:.3f}  R2 {fit[2]:.3f}  mean d* "
          f"{np.mean(list(res['d_star'].values())):.3f}   (paper: sigma 0.22, R2 0.92)")
    print(f"{'scheduler':30s} {'under %':>8s} {'in %':>8s} {'over %':>8s} {'rollouts/R':>11s}")
    for k, v in {**rep, **{"budget: " + k: v for k, v in budget.items()}}.items():
        print(f"{k:30s} {100 * v['under']:8.1f} {100 * v['in']:8.1f} {100 * v['over']:8.1f} "
              f"{v['rollouts_per_R']:11.2f}")
    print(f"(JSON and fig2a/fig2b/fig3a/fig3b PNGs in {args.out})")
    return res


def dstar_over_steps(results, path):
    """The learning picture: the distribution of d* at each checkpoint of a run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in results]
    ax.boxplot([list(r["d_star"].values()) for r in results], positions=steps,
               widths=max(1, (max(steps) - min(steps)) / 10 if len(steps) > 1 else 1))
    ax.set(xlabel="training step", ylabel="d*_i (depth where p is closest to 0.5)",
           title="d* across training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)

"""Evaluation: the hint-free panel, the paper's diagnostic protocol (docs/method.md §6), the dynamics figure and
tables.

    python eval.py panel --model CKPT [--split valid_unseen] [--games builtin|official] [--seeds 0 1 2] [--decode greedy|sampled]
    python eval.py panel --model CKPT --eval_protocol authors --split valid_seen   # their draw, seed s = validation s
    python eval.py panel --model CKPT --env webshop --split eval     # WebShop: success and score (100 x mean reward)
    python eval.py diagnose --model CKPT [--tasks 8] [--rollouts 32] [--grid 0.1] [--checkpoints RUN_DIR]
    python eval.py dynamics RUN_DIR... [--out docs/dynamics.png]
    python eval.py table RUN_DIR...

A checkpoint is evaluated under the config it was trained with (its config.json.run); flags override it, and
--preset/any train.py flag works here too. `evaluate()` is also what train.py calls in the loop, so in-loop and
offline numbers agree for the same checkpoint, seed and decoding.
"""
import argparse
import collections
import dataclasses
import glob
import json
import math
import os
import re
import sys

import numpy as np

from rollout import rollout


def evaluate(engine, pool, tok, tasks, cfg, seed=0, temperature=0.0):
    """Hint-free, one episode per task, greedy (temperature 0) or sampled. Returns {"success", "n", "won",
    "score" (100 x mean raw reward: WebShop's score; ALFWorld's equals success), "per_type": {type: success},
    "per_type_won": {type: [won, n]},
    "invalid", "out": the rollout output (rows + episodes, for transcripts)}."""
    if not tasks:
        return {"success": float("nan"), "n": 0, "won": 0, "score": float("nan"), "per_type": {}, "per_type_won": {},
                "invalid": 0.0,
                "out": None}
    ecfg = dataclasses.replace(cfg, temperature=temperature)
    out = rollout(engine, pool, tok, [{"task": t, "n": 0, "R": 1} for t in tasks], ecfg, seed)
    by = collections.defaultdict(list)
    for e, t in zip(out["episodes"], tasks):
        by[t["task_type"]].append(int(e["won"]))
    won = [e["won"] for e in out["episodes"]]
    return {"success": sum(won) / len(won), "n": len(won), "won": sum(won),
            "score": 100 * float(np.mean([e["score"] for e in out["episodes"]])),
            "per_type": {k: sum(v) / len(v) for k, v in sorted(by.items())},
            "per_type_won": {k: [sum(v), len(v)] for k, v in sorted(by.items())},
            "invalid": out["stats"]["invalid"] / max(out["stats"]["env_steps"], 1), "out": out}


def eval_splits(cfg):
    """--eval_split's splits, each with the name it is logged under: one split is 'val'; several keep their names."""
    splits = [x.strip() for x in cfg.eval_split.split(",") if x.strip()]
    return [("val" if len(splits) == 1 else sp, sp) for sp in splits]


def evals_due(cfg, step):
    """-> (the panel is due, the authors' protocol is due) at this step (it is the step's evaluation, before its
    training, or the run's end at step == cfg.steps). Both run before training and at the end; the panel every
    --eval_every steps, the authors' draw every --authors_every (their trainer.test_freq with val_before_train)."""
    edge = step == 0 or step == cfg.steps
    panel = cfg.eval_protocol in ("panel", "both") and (edge or bool(cfg.eval_every and step % cfg.eval_every == 0))
    authors = cfg.eval_protocol in ("authors", "both") and (edge or step % cfg.authors_every == 0)
    return panel, authors


def authors_draw(n_tasks, k, env, episodes=128, seed=1000):
    """Which tasks the authors' validation number k plays (k = 0: the one before training): task positions, one per
    episode, repeats possible. Their val_data_size=128 env workers, worker i seeded env.seed + 1000 + i
    [ZJU-REAL/Agent-G2 agent_system/environments/env_manager.py, make_envs; .../alfworld/envs.py, AlfworldWorker]:
    - ALFWorld: worker i shuffles the split's games with np.random.RandomState(1000 + i) and plays them in that order,
      reshuffling the list with the same generator after each pass; validation k is the k-th game of every stream
      (TextWorld's TextworldBatchGymEnv.seed and textworld/gym/envs/utils.py, shuffled_cycle).
    - WebShop: one np.random.RandomState(1000) draws 128 distinct goals of the pool per validation and keeps
      running, so validation k is its (k+1)-th draw (.../webshop/envs.py, WebshopMultiProcessEnv.reset)."""
    if env == "webshop":
        rng = np.random.RandomState(seed)
        for _ in range(k + 1):
            pick = rng.choice(n_tasks, size=episodes, replace=False)
        return pick.tolist()
    out = []
    for i in range(episodes):
        rng = np.random.RandomState(seed + i)
        order = list(range(n_tasks))
        rng.shuffle(order)
        for _ in range(k // n_tasks):  # each completed pass reshuffles the list in place
            rng.shuffle(order)
        out.append(order[k % n_tasks])
    return out


def authors_index(step, every):
    """How many of the authors' evaluations came before the one at `step` (at 0, every, 2 every, ..., and the end)."""
    return 0 if step == 0 else (step - 1) // every + 1


def eval_sets(cfg, step, val, panel):
    """The evaluations due at `step`: [(name, tasks, [(suffix, temperature)])]. val: [(name, tasks)] per eval split;
    panel: the fixed training tasks. The panel plays every task once, greedy and sampled at --eval_temperature; the
    authors' protocol plays their draw of the first split's tasks, sampled (their val_kwargs: do_sample, 0.4)."""
    do_panel, do_authors = evals_due(cfg, step)
    both = [("", 0.0), ("_sampled", cfg.eval_temperature)]
    sets = [(name, tasks, both) for name, tasks in val + [("train_panel", panel)] if tasks] if do_panel else []
    if do_authors and val and val[0][1]:
        split = eval_splits(cfg)[0][1]
        tasks = val[0][1]
        pick = authors_draw(len(tasks), authors_index(step, cfg.authors_every), cfg.env, cfg.authors_episodes)
        sets.append((f"authors_{split}", [tasks[i] for i in pick], [("_sampled", cfg.eval_temperature)]))
    return sets


def in_loop_eval(engine, pool, tok, sets, cfg, step, rank=0, world=1, gather=lambda x: [x]):
    """train.py's evaluation: each set of eval_sets hint-free, at each of its decodings (greedy: temperature 0),
    sharded over ranks (gather: all_gather_object); rank 0 writes a few decoded transcripts per set to
    out_dir/transcripts/. -> {"val": success, "val_sampled": ..., "train_panel": ..., ..., "counts": {"val": {"won",
    "n", "per_type": {type: [won, n]}}, ...}}: the counts give the tables their Wilson intervals."""
    res, counts = {}, {}
    for name, tasks, decodes in sets:
        for suffix, temp in decodes:
            mine = tasks[rank::world]
            seed = (2 * 10**6 if name.startswith("authors_") else 10**6) + step
            r = evaluate(engine, pool, tok, mine, cfg, seed=seed, temperature=temp) if mine else None
            if r and rank == 0:
                write_transcripts(os.path.join(cfg.out_dir, "transcripts", f"step{step:06d}_{name}{suffix}.txt"),
                                  r["out"], tok, header=f"step {step} {name}{suffix} temperature {temp}")
            got = gather({"won": r["won"], "n": r["n"], "reward": sum(e["score"] for e in r["out"]["episodes"]),
                          "per_type": r["per_type_won"]} if r else {"won": 0, "n": 0, "reward": 0.0, "per_type": {}})
            won, n = sum(x["won"] for x in got), sum(x["n"] for x in got)
            types = sorted({k for x in got for k in x["per_type"]})
            counts[name + suffix] = {"won": won, "n": n, "per_type": {
                k: [sum(x["per_type"].get(k, [0, 0])[i] for x in got) for i in (0, 1)] for k in types}}
            res[name + suffix] = won / max(n, 1)
            if cfg.env == "webshop":  # WebShop's second metric, mean raw reward (the paper's score / 100)
                res[name + suffix + "_score"] = sum(x["reward"] for x in got) / max(n, 1)
    return {**res, "counts": counts}


def write_transcripts(path, out, tok, k=3, header=""):
    """The first k episodes of a rollout output, decoded turn by turn (prompt, reply, parsed action, reward):
    the first thing to read when a number looks wrong."""
    from rollout import parse_action
    lines = [header] if header else []
    for e in out["episodes"][:k]:
        lines.append(f"=== episode {e['eid']} task {e['task_id']} prefix {e['n']} won {e['won']} reward {e['reward']} "
                     f"steps {e['steps']} invalid {e['invalid']} error {e['error']}")
        for r in [r for r in out["rows"] if r["eid"] == e["eid"]]:
            lines += [f"--- turn {r['t']} prompt:", tok.decode(r["prompt_ids"], skip_special_tokens=False),
                      f"--- reply: {r.get('text', tok.decode(r['response_ids']))!r}",
                      f"--- action: {parse_action(r.get('text', ''))!r} valid {r['valid']}"]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_log(run):
    """log.jsonl of a run -> (step records, eval records), each a list of dicts in step order."""
    steps, evals = [], []
    for line in open(os.path.join(run, "log.jsonl")):
        r = json.loads(line)
        (evals if "eval" in r else steps).append(r)
    return steps, evals


EVAL_SETS = [(("train_panel", "authors_valid_seen", "authors_eval"), "training panel / the authors' draw"),
             (("val", "valid_seen", "valid_unseen"), "validation")]  # the figure's two success panels


def eval_table(runs):
    """Markdown: hint-free success (%) of each run at each evaluation, greedy and sampled, panel and validation."""
    out = ["| run | step | panel greedy | panel sampled | val greedy | val sampled |", "|---|---|---|---|---|---|"]
    for run in runs:
        for e in read_log(run)[1]:
            v = e["eval"]
            cell = lambda k: f"{100 * v[k]:.1f}" if k in v else ""  # noqa: E731
            out.append(f"| {run_label(run)} | {e['step']} | {cell('train_panel')} | "
                       f"{cell('train_panel_sampled')} | {cell('val')} | {cell('val_sampled')} |")
    return "\n".join(out)


def step_table(runs):
    """Markdown: what each run's training steps looked like (means over its steps; the max for on-policy checks)."""
    out = ["| run | steps | batch success | groups in band | all-0 | all-1 | zero-adv groups | mean depth ratio | "
           "max clipfrac | max ratio dev | mean update ‖Δθ‖/‖θ‖ | s / step |", "|---|" + "---|" * 11]
    for run in runs:
        st = read_log(run)[0]
        m = lambda k: float(np.mean([r[k] or 0 for r in st]))  # noqa: E731
        out.append(f"| {run_label(run)} | {len(st)} | {m('success'):.2f} | "
                   f"{100 * m('in_band'):.0f} % | {100 * m('all0'):.0f} % | {100 * m('all1'):.0f} % | "
                   f"{sum(r['zero_adv_groups'] for r in st)} / {sum(r['groups'] for r in st)} | {m('mean_r'):.2f} | "
                   f"{max(r.get('clipfrac', 0) for r in st):.3f} | {max(r.get('ratio_dev', 0) for r in st):.1e} | "
                   f"{m('update_rel'):.1e} | {m('t_step'):.1f} |")
    return "\n".join(out)


def window_table(runs):
    """Markdown: the training batches over time, one row per (method, window of steps), pooled over the method's
    seeds (run_name groups runs/x/g2/s0, s1, ... as g2): batch success at the scheduled depths, group shares, mean
    depth ratio, rollouts and seconds per step. Windows: the first 10 steps, then blocks of 50."""
    by = collections.defaultdict(list)
    for run in runs:
        by[run_name(run)].append(read_log(run)[0])
    out = ["| method | seeds | steps | batch success | all-0 groups | groups in band | all-1 groups | mean depth ratio | "
           "rollouts / step | s / step |", "|---|" + "---|" * 9]
    for name, logs in by.items():
        n = max(len(st) for st in logs)
        edges = sorted({0, min(10, n), n} | set(range(50, n, 50)))
        for a, b in zip(edges, edges[1:]):
            rs = [r for st in logs for r in st if a <= r["step"] < b]
            seeds = sum(any(a <= r["step"] < b for r in st) for st in logs)  # a seed still running may lack a window
            m = lambda k: float(np.mean([r.get(k) or 0 for r in rs]))  # noqa: E731
            out.append(f"| {name} | {seeds} | {a}–{b - 1} | {m('success'):.3f} | {100 * m('all0'):.0f} % | "
                       f"{100 * m('in_band'):.0f} % | {100 * m('all1'):.0f} % | {m('mean_r'):.2f} | "
                       f"{m('rollouts_played'):.0f} | {m('t_step'):.1f} |")
    return "\n".join(out)


def trailing_mean(v, w=10):
    """[n] -> [n - w + 1]: the mean of each w consecutive values (all of v's mean, once, when it is shorter)."""
    w = min(w, len(v))
    return np.convolve(v, np.ones(w), "valid") / w if w else np.asarray(v, dtype=float)


def dynamics(runs, path):
    """The training-dynamics figure from log.jsonl: hint-free success (panel, validation; greedy solid, sampled
    dashed), batch success at the scheduled depths, depth (mean ratio, mu_global), group shares, and sigma per
    cluster, all against step. One colour per method (run_name), its seeds in lighter shades. Prints the eval, step
    and window tables."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 3, figsize=(15, 7.5))
    ax = ax.ravel()
    methods = list(dict.fromkeys(run_name(r) for r in runs))  # one colour per method; its seeds share it
    for j, run in enumerate(runs):
        name, c = run_label(run), f"C{methods.index(run_name(run))}"
        seed_no = sum(run_name(r) == run_name(run) for r in runs[:j])
        alpha = max(0.35, 1.0 - 0.3 * seed_no)  # seeds of one method: the same colour, fainter
        steps, evals = read_log(run)
        for a, (keys, title) in zip(ax[:2], EVAL_SETS):
            for k in keys:
                tag = "" if k in ("val", "train_panel") else f" {k}"
                for suffix, ls in (("", "-"), ("_sampled", "--")):
                    pts = [(e["step"], 100 * e["eval"][k + suffix]) for e in evals if k + suffix in e["eval"]]
                    if pts:
                        a.plot(*zip(*pts), ls, color=c, alpha=alpha, marker="o", ms=4,
                               label=f"{name}{tag}{' sampled' if suffix else ''}")
            a.set_title(f"{title}, hint-free: greedy, sampled (--)", fontsize=10)
        x = [r["step"] for r in steps]
        sm = trailing_mean
        xs = x[len(x) - len(sm(x)):]  # each point: the mean of the 10 steps up to it
        hinted = any(r.get("mean_r") for r in steps)  # a run without hints has no depth or sigma to draw
        ax[2].plot(xs, sm([100 * (r["success"] or 0) for r in steps]), color=c, alpha=alpha, label=name)
        ax[3].plot(xs, sm([r["mean_r"] or 0 for r in steps]), color=c, alpha=alpha, label=f"{name} mean r")
        if hinted:
            ax[3].plot(xs, sm([r["mu_global"] for r in steps]), ":", color=c, alpha=alpha, label=f"{name} mu_global")
        for k in range(len(steps[0]["mu_k"]) if steps and hinted else 0):
            ax[3].plot(xs, sm([r["mu_k"][k] for r in steps]), linestyle=["--", "-.", (0, (1, 3)), (0, (5, 1))][k % 4],
                       color=c, alpha=0.5 * alpha, lw=0.8, label=f"{name} mu_k{k}")
        for key, ls in (("in_band", "-"), ("all0", "--"), ("all1", ":")):
            ax[4].plot(xs, sm([r[key] or 0 for r in steps]), ls, color=c, alpha=alpha, label=f"{name} {key}")
        for k in range(len(steps[0]["sigma_k"]) if steps and hinted else 0):
            ax[5].plot(xs, sm([r["sigma_k"][k] for r in steps]), ["-", "--", ":", "-."][k % 4], color=c,
                       alpha=alpha, label=f"{name} k{k}")
    titles = [None, None, "batch success % at the scheduled depth", "depth: mean r, mu_global (:), mu_k (thin)",
              "groups: in band [0.4, 0.6], all-0 (--), all-1 (:)", "sigma_k of hinted runs: k0, k1 (--), k2 (:)"]
    titles = titles[:2] + [t + "; 10-step means" for t in titles[2:]]
    for a, t in zip(ax, titles):
        if t:
            a.set_title(t, fontsize=10)
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    ax[0].set_ylabel("success %")
    # one legend for the figure, one entry per run (the batch-success lines): per-panel legends of a 14-run grid
    # cover the curves; line styles are named in each panel's title
    handles, labels = ax[2].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    print(eval_table(runs))
    print()
    print(step_table(runs))
    print()
    print(window_table(runs))
    print(f"(plot: {path})")


# ---------------------------------------------------------------------------------------------
# panel: every game of a split, once per seed, hint-free
# ---------------------------------------------------------------------------------------------
def wilson(k, n, z=1.96):
    """95 % Wilson score interval of k successes in n trials -> (lo, hi)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, c - h), min(1.0, c + h))


def panel(engine, pool, tok, tasks, cfg, seeds, temperature, path, protocol="panel"):
    """protocol "panel": play every task once per seed; "authors": per seed s, the authors' validation number s
    (authors_draw: --authors_episodes episodes, repeats possible; s = 0 is the one before training). Per seed:
    overall and per-type success with Wilson intervals; across seeds: mean and std. Results are written to `path`
    after each seed, and a rerun skips the seeds already there."""
    res = json.load(open(path)) if os.path.exists(path) else {}
    key = {"tasks": [t["id"] for t in tasks], "temperature": temperature, "model": cfg.model, "protocol": protocol}
    if res.get("key") != key:
        res = {"key": key, "seeds": {}}
    for s in seeds:
        if str(s) in res["seeds"]:
            print(f"[panel] seed {s}: done already ({path})")
            continue
        played = tasks if protocol == "panel" else [tasks[i] for i in authors_draw(len(tasks), s, cfg.env,
                                                                                   cfg.authors_episodes)]
        r = evaluate(engine, pool, tok, played, cfg, seed=s, temperature=temperature)
        res["seeds"][str(s)] = {"won": r["won"], "n": r["n"], "success": r["success"], "ci95": wilson(r["won"], r["n"]),
                                "score": r["score"],
                                "per_type": {k: {"won": w, "n": m, "success": w / m, "ci95": wilson(w, m)}
                                             for k, (w, m) in r["per_type_won"].items()},
                                "invalid": r["invalid"]}
        json.dump(res, open(path + ".tmp", "w"), indent=1)
        os.replace(path + ".tmp", path)
    per = [res["seeds"][str(s)] for s in seeds]
    res["mean"] = float(np.mean([p["success"] for p in per]))
    res["std"] = float(np.std([p["success"] for p in per]))
    res["score_mean"] = float(np.mean([p["score"] for p in per]))
    res["per_type_mean"] = {k: float(np.mean([p["per_type"][k]["success"] for p in per if k in p["per_type"]]))
                            for k in sorted({k for p in per for k in p["per_type"]})}
    json.dump(res, open(path, "w"), indent=1)
    return res


# ---------------------------------------------------------------------------------------------
# diagnose: the docs/method.md §6 protocol
# ---------------------------------------------------------------------------------------------
def measure_curves(engine, pool, tok, tasks, cfg, grid, R, seed=0, chunk=64):
    """p_i(d) for every task and every depth ratio d of the grid, from R rollouts each (n = prefix_len(d, L); grid
    points that give the same n share one group). -> {task id: {"L", "type", "d": [...], "n": [...], "p": [...]}}"""
    from tqdm import tqdm
    from scheduler import prefix_len
    pairs = sorted({(i, prefix_len(d, t["L"])) for i, t in enumerate(tasks) for d in grid})
    print(f"[diagnose] {len(tasks)} tasks x {len(grid)} depths -> {len(pairs)} groups x R={R} = "
          f"{len(pairs) * R} rollouts (temperature {cfg.temperature})")
    succ = {}
    per = max(1, chunk // R)
    for j in tqdm(range(0, len(pairs), per), desc="diagnose", unit="batch"):
        part = pairs[j:j + per]
        out = rollout(engine, pool, tok, [{"task": tasks[i], "n": n, "R": R} for i, n in part], cfg, seed + j)
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
    """Least squares a * exp(-x^2 / (2 sigma^2)): for each sigma the best a is closed-form; sigma by a fine grid
    search then a local refinement. -> (a, sigma, R^2)"""
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
    """Each scheduler's rule picks a depth for every measured task, as in training (the real Scheduler code), and
    probe methods probe the measured curves (R Bernoulli draws at the measured p). A task group lands under, in or
    over the band by the measured p at the chosen depth (nearest measured depth). rules: [(label, overrides)];
    the label "Agent-G2 (checkpoint state)" loads sched_state. -> {label: {"under", "in", "over", "rollouts_per_R"}}"""
    from scheduler import Scheduler, is_g2
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
        base = cfg.scheduler if is_g2(cfg.scheduler) else "g2"  # {} = the run's Agent-G²-family rule, its settings
        c = dataclasses.replace(cfg, **{"scheduler": base, **ov})
        counts, rollouts = collections.Counter(), 0
        for k in range(draws):
            s = Scheduler(c, [t["id"] for t in train_tasks], [t["L"] for t in train_tasks], seed=seed + k)
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
    from bench import BUDGET, SCHEDULERS
    from scheduler import is_g2
    grid = [round(x, 4) for x in np.arange(0, 1 + 1e-9, args.grid)]
    c = dataclasses.replace(cfg, group_size=args.rollouts)
    curves = measure_curves(engine, pool, tok, tasks, c, grid, args.rollouts, seed=cfg.seed)
    prof = aligned_profile(curves, args.grid)
    fit = fit_gaussian(prof[0], prof[1])
    st_path = os.path.join(ckpt, "state.json")
    st = json.load(open(st_path)) if os.path.exists(st_path) else {}
    step = st.get("step", 0)
    rules = list(SCHEDULERS) + ([("Agent-G2 (checkpoint state)", {})] if st and is_g2(cfg.scheduler) else [])
    rep = replay(curves, cfg, train_tasks, rules, step, st.get("sched"), args.draws, cfg.seed)
    budget = replay(curves, cfg, train_tasks, BUDGET, step, None, args.draws, cfg.seed)
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
        print(f"{k:30s} {100 * v['under']:8.1f} {100 * v['in']:8.1f} {100 * v['over']:8.1f} {v['rollouts_per_R']:11.2f}")
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
    ax.set(xlabel="training step", ylabel="d*_i (depth where p is closest to 0.5)", title="d* across training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# ---------------------------------------------------------------------------------------------
# table: finished runs -> Markdown, mean ± std over seeds
# ---------------------------------------------------------------------------------------------
def run_summary(run, wall_s=None):
    """A run directory -> {config, final (the last evaluation) and best (best_evals) hint-free success, every
    evaluation, rollouts, seconds and rollouts per step, commit, date}. Read from its summary.json when there is one (train.py writes it at the end;
    results/ keeps only these), else computed from config.json + log.jsonl."""
    path = os.path.join(run, "summary.json")
    if wall_s is None and os.path.exists(path):
        return {**json.load(open(path)), "run": run}
    import datetime
    cfg = json.load(open(os.path.join(run, "config.json")))
    steps, evals = read_log(run)
    return {"run": run, "cfg": cfg, "git_commit": cfg.get("git_commit", ""), "steps": len(steps),
            "final": evals[-1]["eval"] if evals else {}, "final_step": evals[-1]["step"] if evals else 0,
            "best": best_evals(evals), "evals": evals, "rollouts": int(sum(r["rollouts_played"] for r in steps)),
            "s_per_step": float(np.mean([r["t_step"] for r in steps])) if steps else float("nan"),
            "rollouts_per_step": float(np.mean([r["rollouts_played"] for r in steps])) if steps else float("nan"),
            "wall_s": wall_s, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def best_evals(evals):
    """{key: {"value", "step"}}: each logged success or score at its best evaluation (the earliest of ties), beside
    the last one: the paper may report either reading."""
    best = {}
    for e in evals:
        for k, v in e["eval"].items():
            if k != "counts" and v == v and (k not in best or v > best[k]["value"]):
                best[k] = {"value": v, "step": e["step"]}
    return best


def eval_label(key):
    """'val' -> 'validation greedy', 'val_sampled' -> 'sampled', 'valid_seen_sampled' -> 'valid_seen sampled'."""
    if key in ("val", "val_sampled"):
        return "validation greedy" if key == "val" else "sampled"
    name = key[:-len("_sampled")] if key.endswith("_sampled") else key
    name = "authors' draw on " + name[len("authors_"):] if name.startswith("authors_") else name
    return name.replace("train_panel", "train panel") + (" sampled" if key.endswith("_sampled") else " greedy")


def end_lines(summary, out_dir):
    """The two lines a training run ends with: hint-free success at its first and last evaluation (greedy and
    sampled on validation, greedy on the training panel; each validation split and the authors' draw where they ran)
    and at the best one, the wall time, where its files are and the command that draws its figure.
    summary: run_summary's dict."""
    ev = summary.get("evals") or [{"step": 0, "eval": {}}]
    a, b, best = ev[0]["eval"], ev[-1]["eval"], summary.get("best") or {}
    keys = [k for k in b if k not in ("counts", "train_panel_sampled") and not k.endswith("_score")]
    parts = [f"{eval_label(k)} {100 * a[k]:.1f}% -> {100 * b[k]:.1f}%" +
             (f" (best {100 * best[k]['value']:.1f}% at {best[k]['step']})" if k in best else "")
             for k in keys if a.get(k) is not None and b.get(k) is not None]
    wall = summary.get("wall_s")
    return (f"[done] hint-free success, step {ev[0]['step']} -> {ev[-1]['step']}: " + (" | ".join(parts) or "no eval")
            + (f" | wall {wall / 60:.1f} min" if wall else "") + "\n"
            f"[done] files: {out_dir}/ (log.jsonl, summary.json, config.json, transcripts/, ckpt_*)  "
            f"figure: python eval.py dynamics {out_dir} --out {os.path.join(out_dir, 'dynamics.png')}")


def env_label(cfg):
    """'alfworld', 'webshop' (the official environment) or 'webshop-lite': lite numbers are never WebShop's."""
    env = cfg.get("env", "alfworld")
    return "webshop-lite" if env == "webshop" and cfg.get("webshop_backend", "lite") == "lite" else env


def run_name(run):
    """runs/x/g2/s0 -> 'g2' (run_all.sh's layout: one directory per seed), else the directory name."""
    base = os.path.basename(os.path.normpath(run))
    return os.path.basename(os.path.dirname(os.path.abspath(run))) if re.fullmatch(r"s\d+", base) else base


def run_label(run):
    """runs/x/g2/s0 -> 'g2/s0' (run_all.sh's layout), else the directory name."""
    base = os.path.basename(os.path.normpath(run))
    return base if run_name(run) == base else f"{run_name(run)}/{base}"


def run_flags(cfg):
    """The command-line flags a run was started with, less seed/out_dir/resume and the preset (the table's header
    names it): what makes it this method."""
    argv, out, skip = cfg.get("argv", [])[1:], [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--seed", "--out_dir", "--resume", "--preset"):
            skip = True
            continue
        out.append(a)
    return " ".join(out)


PAPER_TABLES = [  # run_all.sh's names, grouped like the paper's tables
    ("Tables 1-2: main comparison", ["g2", "grpo", "fixed", "linear", "cosine", "step", "target_acc", "binary", "enum",
                                     "released", "released_rules", "g2_7b", "grpo_7b"]),
    ("Table 3: ablations", ["no_sampling", "uniform", "no_adapt_centre", "no_adapt_spread", "no_aux", "no_grpo"]),
    ("Table 8: clusters (K = 3 is g2)", ["K1", "K5", "K10", "random"]),
    ("SFT baselines", ["sft_full", "sft_prefix"]),
    ("WebShop (Tables 1-2)", ["ws_g2", "ws_grpo", "ws_fixed", "ws_linear", "ws_cosine", "ws_step", "ws_target_acc",
                              "ws_binary", "ws_enum", "ws_released"])]


def table(runs):
    """One row per method (run name), columns = final hint-free success and cost, mean ± std over seeds; each row
    gives the flags it ran with and the commits. Never mixes presets, game sets, environments or task types: it
    says so in a first line and makes one table each."""
    sums = [run_summary(r) for r in runs]
    groups = collections.defaultdict(list)
    for s in sums:
        c = s["cfg"]
        data = f"games {c.get('games')}{' / ' + c['task_types'] if c.get('task_types') else ''}" \
            if c.get("env", "alfworld") == "alfworld" else \
            f"{c.get('webshop_products')} products, catalogue seed {c.get('webshop_seed')}" \
            if c.get("webshop_backend") == "lite" else "official goals and products"
        groups[(env_label(c), c.get("preset"), data)].append(s)
    out = [f"note: these runs come from {len(groups)} different (environment, preset, data) settings; "
           "one table each, never mixed"] if len(groups) > 1 else []
    ci_note = ("\n[lo–hi]: 95 % Wilson interval of the row's final-eval games pooled over its seeds. Every seed plays "
               "the same games, so it covers their binomial noise only, not seed-to-seed spread. Runs logged before "
               "success counts were have none.")
    for (env, preset, data), ss in groups.items():
        rows = collections.defaultdict(list)
        for s in ss:
            rows[run_name(s["run"])].append(s)
        part = {n: t for t, names in PAPER_TABLES for n in names}
        order = {n: (i, j) for i, (_, names) in enumerate(PAPER_TABLES) for j, n in enumerate(names)}
        sets = [k for k in ("train_panel", "train_panel_sampled", "val", "val_sampled", "train_panel_score",
                            "val_score")
                if any(k in s["final"] for s in ss)]
        # the paper presets' splits and the authors' draw: the last evaluation and the best one, side by side (the
        # paper may report either); sampled (T = 0.4 there) first, then greedy
        named = sorted({k for s in ss for k in s["final"] if k.startswith(("valid_", "authors_"))},
                       key=lambda k: (k.startswith("authors_"), k.replace("_sampled", ""), not k.endswith("_sampled")))
        sets += [(k, when) for k in named for when in ("last", "best")]
        out.append(f"\n**{env} / preset {preset} / {data}**\n")
        out.append("| method | seeds | " + " | ".join(column_name(k) for k in sets) +
                   " | s/step | rollouts/step | flags | commits |")
        out.append("|---|---|" + "---|" * len(sets) + "---|---|---|---|")
        ordered = sorted(rows.items(), key=lambda kv: (order.get(kv[0], (99, 0)), kv[0]))
        last = None
        for label, rs in ordered:
            if part.get(label, "other runs") != last:
                last = part.get(label, "other runs")
                out.append(f"| *{last}* |" + " |" * (len(sets) + 5))
            cells = [mean_std([100 * r["best"][k[0]]["value"] for r in rs if k[0] in r.get("best", {})])
                     if isinstance(k, tuple) and k[1] == "best" else
                     mean_std([100 * r["final"][k[0]] for r in rs if k[0] in r["final"]]) if isinstance(k, tuple) else
                     mean_std([100 * r["final"][k] for r in rs if k in r["final"]]) + pooled_ci(rs, k) for k in sets]
            flags = sorted({run_flags(r["cfg"]) for r in rs})
            commits = ",".join(sorted({r["cfg"].get("git_commit", "?") for r in rs}))
            out.append(f"| {label} | {len(rs)} | " + " | ".join(cells) +
                       f" | {mean_std([r['s_per_step'] for r in rs])} | "
                       f"{mean_std([r['rollouts_per_step'] for r in rs])} | "
                       f"`{' / '.join(flags) or '-'}` | {commits} |")
        if any("counts" in s["final"] for s in ss):
            out.append(ci_note)
        types = sorted({t for s in ss for c in s["final"].get("counts", {}).values() for t in c["per_type"]})
        if len(types) > 1:  # per task type: the pooled games of each row (at the last evaluation)
            succ = [k for k in sets if not isinstance(k, tuple) and not k.endswith("_score")] + \
                [k for k, when in sets[len([x for x in sets if not isinstance(x, tuple)]):] if when == "last"]
            out.append("\n| method | task type | " + " | ".join(f"{k} (won / games)" for k in succ) + " |")
            out.append("|---|---|" + "---|" * len(succ))
            for label, rs in ordered:
                for t in types if all("counts" in r["final"] for r in rs) else []:
                    out.append(f"| {label} | {t} | " + " | ".join(pooled_ci(rs, k, t) for k in succ) + " |")
    return "\n".join(out).lstrip("\n")


def column_name(k):
    """A table column: 'val %', 'val score', or ('valid_seen_sampled', 'best') -> 'valid_seen_sampled % best'."""
    if isinstance(k, tuple):
        return f"{k[0]} % {k[1]}"
    return k[:-6] + " score" if k.endswith("_score") else f"{k} %"


def mean_std(v):
    """A table cell: mean ± std over seeds, NaNs dropped; one seed shows its value (it has no std)."""
    v = [x for x in v if x == x]
    if not v:
        return ""
    if len(v) == 1:
        return f"{v[0]:.1f}"
    return f"{np.mean(v):.1f} ± {np.std(v):.1f}"


def pooled_ci(rs, k, task_type=None):
    """' [lo–hi]' (%): the 95 % Wilson interval of set k's final-eval games pooled over the runs rs, or with
    task_type, 'p % [lo–hi] (won / n)' for that type's games; '' when a run has no counts (logged before them)."""
    c = [r["final"].get("counts", {}).get(k) for r in rs]
    if not c or any(x is None for x in c):
        return ""
    pairs = [(x["won"], x["n"]) if task_type is None else x["per_type"].get(task_type, (0, 0)) for x in c]
    won, n = sum(w for w, _ in pairs), sum(m for _, m in pairs)
    if n == 0:
        return ""
    lo, hi = wilson(won, n)
    return f" [{100 * lo:.0f}–{100 * hi:.0f}]" if task_type is None else \
        f"{100 * won / n:.1f} [{100 * lo:.0f}–{100 * hi:.0f}] ({won} / {n})"


def main():
    from config import get_config
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd in ("dynamics", "table"):
        args = sys.argv[2:]
        if cmd == "table":  # a directory without a run in it stands for every run below it
            runs = [r for a in args if not a.startswith("--") for r in
                    ([a] if os.path.exists(os.path.join(a, "config.json")) or os.path.exists(os.path.join(a, "summary.json"))
                     else sorted(os.path.dirname(p) for p in glob.glob(os.path.join(a, "**", "summary.json"), recursive=True)))]
            return print(table(runs))
        out = args[args.index("--out") + 1] if "--out" in args else "docs/dynamics.png"
        return dynamics([a for a in args if not a.startswith("--") and a != out], out)
    if cmd in ("", "-h", "--help"):
        return print(__doc__ + "\nsubcommands: panel | diagnose | dynamics | table  (`python eval.py panel --help`)")
    if cmd not in ("panel", "diagnose"):
        sys.exit(f"error: unknown subcommand {cmd!r}: expected panel | diagnose | dynamics | table")

    def extra(p):
        p.add_argument("--split", default="valid_unseen", help="panel: split to play")
        p.add_argument("--seeds", type=int, nargs="+", default=[0], help="panel: one pass over the split per seed")
        p.add_argument("--decode", default="greedy", choices=["greedy", "sampled"],
                       help="panel: greedy, or sampled at --eval_temperature (--eval_protocol authors: sampled)")
        p.add_argument("--tasks", type=int, default=8, help="diagnose: training tasks in the fixed sample")
        p.add_argument("--rollouts", type=int, default=32, help="diagnose: rollouts per (task, depth)")
        p.add_argument("--grid", type=float, default=0.1, help="diagnose: depth-ratio grid step")
        p.add_argument("--draws", type=int, default=50, help="diagnose: repetitions of each scheduler's replay")
        p.add_argument("--checkpoints", default="", help="diagnose: every checkpoint of this run directory")
        p.add_argument("--out", default="", help="output: JSON path (panel) or directory (diagnose); default under "
                       "runs/eval/<model name>/, never inside a checkpoint")
    argv = sys.argv[2:]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model", default="")
    pre.add_argument("--checkpoints", default="")
    known, _ = pre.parse_known_args(argv)
    if known.checkpoints:
        import ckpt
        if not os.path.isdir(known.checkpoints):
            sys.exit(f"error: --checkpoints {known.checkpoints}: no such directory")
        ckpts = ckpt.complete(known.checkpoints)
    else:
        ckpts = []
    first = ckpts[0] if ckpts else known.model
    run_cfg = os.path.join(first, "config.json.run") if first else ""
    base = json.load(open(run_cfg)) if run_cfg and os.path.exists(run_cfg) else None
    if ckpts:
        base = dict(base or {}, model=ckpts[0])
    cfg, args = get_config(argv, __doc__, extra, base)
    from config import check_data, check_model, model_error
    check_model(cfg.model)  # one-line errors (exit 2) before any heavy work
    check_data(cfg)
    import torch
    from transformers import AutoTokenizer
    from envs import EnvPool, env_spec, tasks_for, train_subset
    from rollout import make_engine, seed_all
    from tiny import resolve_model
    seed_all(cfg.seed)
    path = resolve_model(cfg)
    device = "cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # a hub id that is not reachable (offline, a typo)
        model_error(cfg.model, e)
    pool = EnvPool(cfg.num_workers, env_spec(cfg))
    engine = make_engine(cfg, path, tok, device, cfg.seed)
    runs_dir = os.path.join("runs", "eval", os.path.basename(os.path.normpath(path)))  # never into the checkpoint
    if cmd == "panel":
        tasks = tasks_for(cfg, args.split)
        authors = cfg.eval_protocol == "authors"  # their draw, sampled (their val_kwargs)
        temp = cfg.eval_temperature if authors or args.decode == "sampled" else 0.0
        dec = "greedy" if temp == 0 else f"sampled at T={temp:g}"
        out = args.out or os.path.join(runs_dir, f"{'authors' if authors else 'panel'}_{args.split}_"
                                                 f"{'greedy' if temp == 0 else f't{temp:g}'}.json")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        r = panel(engine, pool, tok, tasks, cfg, args.seeds, temp, out, "authors" if authors else "panel")
        pool.close()
        what = (f"the authors' draw of {cfg.authors_episodes} episodes over {len(tasks)}" if authors else
                f"every one of {len(tasks)}")
        print(f"{path} | {args.split} ({what} {env_label(vars(cfg))} tasks) | {dec} | seeds {args.seeds} | "
              f"success {100 * r['mean']:.1f} ± {100 * r['std']:.1f} %" +
              (f" | score {r['score_mean']:.1f}" if cfg.env == "webshop" else ""))
        for k, v in r["per_type_mean"].items():
            print(f"  {k:32s} {100 * v:5.1f}%")
        print(f"({out})")
        return
    train_tasks = train_subset(tasks_for(cfg, cfg.train_split), cfg.train_games)
    sample = [train_tasks[i] for i in sorted(np.random.default_rng(4321).permutation(len(train_tasks))[:args.tasks])]
    results = []
    outdir = args.out or os.path.join(known.checkpoints or runs_dir, "diagnose")
    for ck in ckpts or [path]:
        if ckpts:
            from transformers import AutoModelForCausalLM
            engine.load_weights(AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32 if device == "cpu"
                                                                     else torch.bfloat16).state_dict().items())
        args.out = os.path.join(outdir, os.path.basename(ck)) if ckpts else outdir
        results.append(diagnose(engine, pool, tok, sample, train_tasks, cfg, args, ck))
    pool.close()
    if ckpts:
        dstar_over_steps(results, os.path.join(outdir, "dstar_vs_step.png"))
        print(f"(d* against step: {os.path.join(outdir, 'dstar_vs_step.png')})")


if __name__ == "__main__":
    main()

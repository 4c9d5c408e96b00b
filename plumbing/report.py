"""Reading runs back: the step line, the run summary (last and best evaluation), the tables and the dynamics
figure.

Contract. step_record(named values) -> the step's record, the same on every rank (log.jsonl); step_line(rec)
-> the one dense line; everything else reads runs back and writes nothing but tables and figures.

    python eval.py table RUN_DIR...                     # Markdown: one row per method, mean ± std over seeds
    python eval.py dynamics RUN_DIR... [--out PNG]      # the training-dynamics figure and three tables

Everything here reads log.jsonl / summary.json / config.json; nothing plays an episode (eval.py does).
"""
import collections
import json
import os
import re

import numpy as np

from config import METHODS, dump
from plumbing.tables import mean_std, regime_tables, wilson


def open_log(cfg, start_step, mode):
    """Rank 0's outputs, opened: the full config to <out_dir>/config.json, log.jsonl (mode "a" on resume, cut
    back to the checkpoint's step first), wandb's run when --wandb. -> (log file, wandb run or None)."""
    from plumbing.ckpt import trim_log
    os.makedirs(cfg.out_dir, exist_ok=True)
    dump(cfg, os.path.join(cfg.out_dir, "config.json"))
    if cfg.resume:
        trim_log(os.path.join(cfg.out_dir, "log.jsonl"), start_step, final=start_step >= cfg.steps)
    log = open(os.path.join(cfg.out_dir, "log.jsonl"), mode)
    if not cfg.wandb:
        return log, None
    import wandb
    run_config = json.load(open(os.path.join(cfg.out_dir, "config.json")))
    return log, wandb.init(project="agent-g2", config=run_config)


def step_line(rec):
    """train.py's one dense line per step, from its log record. The update's stats beyond the fixed ones (a
    loss term's own, named in rec["term_stats"]) follow the update size as `name value`."""
    cl = " ".join(f"k{k}:{m:.2f}/{sg:.2f}/{a:.2f}/{v:.3f}" for k, (m, sg, a, v)
                  in enumerate(zip(rec["mu_k"], rec["sigma_k"], rec["A"], rec["V"])))
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    more = "".join(f" {k} {rec[k]:.4g}" for k in rec.get("term_stats", []))
    return (f"step {rec['step']:4d} | succ {fmt(rec['success'])} band {fmt(rec['in_band'])} "
            f"0s {fmt(rec['all0'])} 1s {fmt(rec['all1'])} | "
            f"pg {rec.get('pg', 0):+.4f} aux {rec.get('aux', 0):.3f} "
            f"kl {rec.get('kl', 0):.4f} clip {rec['clipfrac']:.3f} upd {rec['update_rel']:.1e}{more} | "
            f"mu_g {rec['mu_global']:.2f} {cl} | n {rec['mean_n']:.1f} | "
            f"roll {rec['rollouts']}+{rec['probe_rollouts']} tok {rec['tokens']} "
            f"trunc {rec['truncated_share']:.0%} | "
            f"t probe {rec['t_probe']:.1f} roll {rec['t_rollout']:.1f} train {rec['t_train']:.1f} "
            f"sync {rec['t_sync']:.2f}s")


def step_record(*, step, lr, tasks, p_hat, plan, rule_stats, update, view, task_hints, moved, redraws,
                sync_err, consist, times, t0, per_rank):
    """train.py's log record of a step (log.jsonl; the step line's source), the same on every rank. tasks,
    p_hat: the batch's tasks and success rates in batch order (None: no kept outcome, every episode lost to an
    error or no play); plan, rule_stats: the depth rule's plan and stats(); update: the update's values;
    view, task_hints: what the rule saw of the batch, its hints; moved: the task ids whose hint the step moved
    (observe()); consist: per rank (weight sum, run-state JSON); times: t_* seconds; t0: the step's start;
    per_rank: per rank {"zero_adv_groups", "groups", "rollout" (rollout stats), "probe" (probe stats),
    "episodes", "errors"}. by_type in the record: {task_type: [all-0 groups, groups, mean success]}; tags
    (under a reply format): {tag: its share of the rows} (variants/formats.py tag_counts)."""
    import time
    p_kept = [p for p in p_hat if p is not None]
    mean = lambda xs: float(np.mean(xs)) if p_kept else None  # noqa: E731
    stats, probe_stats = [r["rollout"] for r in per_rank], [r["probe"] for r in per_rank]
    total = lambda key, parts_: sum(x.get(key, 0) for x in parts_)  # noqa: E731
    by_type = collections.defaultdict(list)  # task type -> the p_hat of its played groups
    for p, t in zip(p_hat, tasks):
        if p is not None:
            by_type[t["task_type"]].append(p)
    tags = {k[4:]: total(k, stats) for k in sorted({k for s in stats for k in s if k.startswith("tag_")})}
    return {"step": step, "lr": lr, "success": mean(p_kept),
            "in_band": mean([0.4 <= p <= 0.6 for p in p_kept]),
            "all0": mean([p == 0 for p in p_kept]), "all1": mean([p == 1 for p in p_kept]),
            "by_type": {k: [sum(p == 0 for p in v), len(v), float(np.mean(v))]
                        for k, v in sorted(by_type.items())},
            "zero_adv_groups": sum(r["zero_adv_groups"] for r in per_rank),
            "groups": sum(r["groups"] for r in per_rank),
            **update, "stepped": update["update_rel"] > 0,
            "error_episodes": sum(r["errors"] for r in per_rank),
            "mean_n": float(np.mean(plan["n"])), "mean_r": float(np.mean(plan["r"])),
            "hinted": sum(v["L"] is not None for v in view),  # tasks with a hint to replay
            "text_hints": sum(bool(h and h.text) for h in task_hints),  # tasks with a text hint
            "hints_moved": len(moved),  # tasks whose next hint this step's episodes changed
            **({"tags": {k: v / sum(tags.values()) for k, v in tags.items()}} if tags else {}),  # tag shares
            **rule_stats,  # the depth rule's stats() whole: a new statistic is logged without a line here
            "rollouts": sum(r["episodes"] for r in per_rank),  # trained on (|B| R); the probes' extra ones:
            "probe_rollouts": plan["probe_rollouts"],
            "rollouts_played": total("rollouts", stats) + total("rollouts", probe_stats),
            "tokens": total("gen_tokens", stats) + total("gen_tokens", probe_stats),
            "invalid": total("invalid", stats), "truncated": total("truncated", stats),
            "truncated_share": total("truncated", stats) / max(total("prompts", stats), 1),
            "env_errors": total("errors", stats), "redraws": redraws, "sync_err": sync_err,
            "rank_param_spread": max(c[0] for c in consist) - min(c[0] for c in consist),
            "state_same_on_ranks": len({c[1] for c in consist}) == 1,
            "t_rollout": times["t_rollout"], "t_gen": stats[0].get("t_gen", 0.0),
            "t_env": stats[0].get("t_env", 0.0),
            **{k: times[k] for k in ("t_probe", "t_train", "t_sync", "t_sched")}, "t_step": time.time() - t0,
            "mem_peak_gb": times.get("mem_peak_gb")}


def read_log(run):
    """log.jsonl of a run -> (step records, eval records), each a list of dicts in step order."""
    steps, evals = [], []
    for line in open(os.path.join(run, "log.jsonl")):
        r = json.loads(line)
        (evals if "eval" in r else steps).append(r)
    return steps, evals


# the figure's two success panels (and eval_table's columns, in this order): the training panel or the
# authors' draw beside validation; a regime with held-out games (config/cpu_mix6.py): seen rooms, unseen rooms
EVAL_SETS = [(("train_panel", "authors_valid_seen", "authors_eval", "test_seen"),
              "panel / authors' draw / held-out seen"),
             (("val", "valid_seen", "valid_unseen", "test_unseen"), "validation / held-out unseen")]


def eval_table(runs):
    """Markdown: hint-free success (%) of each run at each evaluation, greedy and sampled, on each split the
    runs evaluated (EVAL_SETS' order: panel and validation, or a regime's held-out seen and unseen rooms)."""
    evals = {run: read_log(run)[1] for run in runs}
    keys = [k for ks, _ in EVAL_SETS for k in ks if any(k in e["eval"] for es in evals.values() for e in es)]
    label = {"train_panel": "panel"}
    cols = [f"{label.get(k, k)} {d}" for k in keys for d in ("greedy", "sampled")]
    out = ["| " + " | ".join(["run", "step"] + cols) + " |", "|---" * (2 + len(cols)) + "|"]
    for run in runs:
        for e in evals[run]:
            v = e["eval"]
            cells = [f"{100 * v[k + s]:.1f}" if k + s in v else "" for k in keys for s in ("", "_sampled")]
            out.append("| " + " | ".join([run_label(run), str(e["step"])] + cells) + " |")
    return "\n".join(out)


def step_table(runs):
    """Markdown: what each run's training steps looked like (means over its steps; the max for
    on-policy checks)."""
    out = ["| run | steps | batch success | groups in band | all-0 | all-1 | zero-adv groups | "
           "mean depth ratio | max clipfrac | max ratio dev | mean update ‖Δθ‖/‖θ‖ | s / step |",
           "|---|" + "---|" * 11]
    for run in runs:
        st = read_log(run)[0]
        m = lambda k: float(np.mean([r[k] or 0 for r in st]))  # noqa: E731
        out.append(f"| {run_label(run)} | {len(st)} | {m('success'):.2f} | "
                   f"{100 * m('in_band'):.0f} % | {100 * m('all0'):.0f} % | {100 * m('all1'):.0f} % | "
                   f"{sum(r['zero_adv_groups'] for r in st)} / {sum(r['groups'] for r in st)} | "
                   f"{m('mean_r'):.2f} | {max(r.get('clipfrac', 0) for r in st):.3f} | "
                   f"{max(r.get('ratio_dev', 0) for r in st):.1e} | "
                   f"{m('update_rel'):.1e} | {m('t_step'):.1f} |")
    return "\n".join(out)


def window_table(runs):
    """Markdown: the training batches over time, one row per (method, window of steps), pooled over the
    method's seeds (run_name groups runs/x/g2/s0, s1, ... as g2): batch success at the scheduled depths, group
    shares, mean depth ratio, rollouts and seconds per step. Windows: the first 10 steps, then blocks of
    50."""
    by = collections.defaultdict(list)
    for run in runs:
        by[run_name(run)].append(read_log(run)[0])
    out = ["| method | seeds | steps | batch success | all-0 groups | groups in band | all-1 groups | "
           "mean depth ratio | rollouts / step | s / step |", "|---|" + "---|" * 9]
    for name, logs in by.items():
        n = max(len(st) for st in logs)
        edges = sorted({0, min(10, n), n} | set(range(50, n, 50)))
        for a, b in zip(edges, edges[1:]):
            rs = [r for st in logs for r in st if a <= r["step"] < b]
            # a seed still running may lack a window
            seeds = sum(any(a <= r["step"] < b for r in st) for st in logs)
            m = lambda k: float(np.mean([r.get(k) or 0 for r in rs]))  # noqa: E731
            out.append(f"| {name} | {seeds} | {a}–{b - 1} | {m('success'):.3f} | {100 * m('all0'):.0f} % | "
                       f"{100 * m('in_band'):.0f} % | {100 * m('all1'):.0f} % | {m('mean_r'):.2f} | "
                       f"{m('rollouts_played'):.0f} | {m('t_step'):.1f} |")
    return "\n".join(out)


def trailing_mean(v, w=10):
    """[n] -> [n - w + 1]: the mean of each w consecutive values (all of v's mean, once,
    when it is shorter)."""
    w = min(w, len(v))
    return np.convolve(v, np.ones(w), "valid") / w if w else np.asarray(v, dtype=float)


def dynamics(runs, path):
    """The training-dynamics figure from log.jsonl (returned, and saved to path): hint-free success (panel and
    validation, or held-out seen and unseen rooms; greedy solid, sampled dashed), batch success at the
    scheduled depths, depth (mean ratio, mu_global), group shares, and sigma per cluster, all against step.
    One colour per method (run_name), its seeds in lighter shades. Prints the eval, step and window tables."""
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
            a.set_title(f"{title}, hint-free (sampled --)", fontsize=10)
        x = [r["step"] for r in steps]
        sm = trailing_mean
        xs = x[len(x) - len(sm(x)):]  # each point: the mean of the 10 steps up to it
        hinted = any(r.get("mean_r") for r in steps)  # a run without hints has no depth or sigma to draw
        ax[2].plot(xs, sm([100 * (r["success"] or 0) for r in steps]), color=c, alpha=alpha, label=name)
        ax[3].plot(xs, sm([r["mean_r"] or 0 for r in steps]), color=c, alpha=alpha, label=f"{name} mean r")
        if hinted:
            ax[3].plot(xs, sm([r["mu_global"] for r in steps]), ":", color=c, alpha=alpha,
                       label=f"{name} mu_global")
        for k in range(len(steps[0]["mu_k"]) if steps and hinted else 0):
            ax[3].plot(xs, sm([r["mu_k"][k] for r in steps]),
                       linestyle=["--", "-.", (0, (1, 3)), (0, (5, 1))][k % 4],
                       color=c, alpha=0.5 * alpha, lw=0.8, label=f"{name} mu_k{k}")
        for key, ls in (("in_band", "-"), ("all0", "--"), ("all1", ":")):
            ax[4].plot(xs, sm([r[key] or 0 for r in steps]), ls, color=c, alpha=alpha, label=f"{name} {key}")
        for k in range(len(steps[0]["sigma_k"]) if steps and hinted else 0):
            ax[5].plot(xs, sm([r["sigma_k"][k] for r in steps]), ["-", "--", ":", "-."][k % 4], color=c,
                       alpha=alpha, label=f"{name} k{k}")
    titles = [None, None, "batch success % at the scheduled depth",
              "depth: mean r, mu_global (:), mu_k (thin)",
              "groups: in band [0.4, 0.6], all-0 (--), all-1 (:)",
              "sigma_k of hinted runs: k0, k1 (--), k2 (:)"]
    titles = titles[:2] + [t + "; 10-step means" for t in titles[2:]]
    for a, t in zip(ax, titles):
        if t:
            a.set_title(t, fontsize=10)
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    ax[0].set_ylabel("success %")
    # one legend for the figure, one entry per run (the batch-success lines): per-panel legends of a 14-run
    # grid cover the curves; line styles are named in each panel's title
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
    return fig


# ---------------------------------------------------------------------------------------------
# runs: summaries and tables (finished runs -> Markdown, mean ± std over seeds)
# ---------------------------------------------------------------------------------------------
def run_summary(run, wall_s=None):
    """A run directory -> {config, final (the last evaluation) and best (best_evals) hint-free success, every
    evaluation, rollouts, seconds and rollouts per step, commit, date}. Read from its summary.json when there
    is one (train.py writes it at the end, with wall_s and the host that ran it; results/ keeps only these),
    else computed from config.json + log.jsonl."""
    path = os.path.join(run, "summary.json")
    if wall_s is None and os.path.exists(path):
        return {**json.load(open(path)), "run": run}
    import datetime
    cfg = json.load(open(os.path.join(run, "config.json")))
    steps, evals = read_log(run)
    return {"run": run, "cfg": cfg, "git_commit": cfg.get("git_commit", ""), "steps": len(steps),
            "final": evals[-1]["eval"] if evals else {}, "final_step": evals[-1]["step"] if evals else 0,
            "best": best_evals(evals), "evals": evals,
            "rollouts": int(sum(r["rollouts_played"] for r in steps)),
            "s_per_step": float(np.mean([r["t_step"] for r in steps])) if steps else float("nan"),
            "rollouts_per_step": (float(np.mean([r["rollouts_played"] for r in steps]))
                                  if steps else float("nan")),
            "wall_s": wall_s,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **({"host": host()} if wall_s is not None else {})}


def host():
    """What ran the run, for comparing its timings and floats: {"cpu": the CPU model, "cpu_capability": the
    vector instruction set torch's own CPU kernels dispatch to, "threads": torch's intra-op threads, "torch":
    version, "gpu": the first CUDA device or ""}. Floats of one seed may differ by rounding between hosts that
    differ in any of these. Of the process that writes the summary: a run resumed elsewhere names the last."""
    import platform
    import subprocess

    import torch
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):  # Linux
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    elif platform.system() == "Darwin":
        cpu = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                             text=True).stdout.strip()
    return {"cpu": cpu or platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""}


def best_evals(evals):
    """{key: {"value", "step"}}: each logged success or score at its best evaluation (the earliest of ties),
    beside the last one: the paper may report either reading."""
    best = {}
    for e in evals:
        for k, v in e["eval"].items():
            if k != "counts" and v == v and (k not in best or v > best[k]["value"]):
                best[k] = {"value": v, "step": e["step"]}
    return best


def eval_label(key):
    """'val' -> 'validation greedy', 'val_sampled' -> 'sampled',
    'valid_seen_sampled' -> 'valid_seen sampled'."""
    if key in ("val", "val_sampled"):
        return "validation greedy" if key == "val" else "sampled"
    name = key[:-len("_sampled")] if key.endswith("_sampled") else key
    name = "authors' draw on " + name[len("authors_"):] if name.startswith("authors_") else name
    return (name.replace("train_panel", "train panel")
            + (" sampled" if key.endswith("_sampled") else " greedy"))


def write_summary(out_dir, wall_s):
    """run_summary of a finished run (with its seconds and host), less the run's path, to summary.json. ->
    that summary."""
    summary = {k: v for k, v in run_summary(out_dir, wall_s=wall_s).items() if k != "run"}
    json.dump(summary, open(os.path.join(out_dir, "summary.json"), "w"), indent=1,
              default=lambda o: o.item() if hasattr(o, "item") else str(o))
    return summary


def end_lines(summary, out_dir):
    """The two lines a training run ends with: hint-free success at its first and last evaluation (greedy and
    sampled on validation, greedy on the training panel; each validation split and the authors' draw where
    they ran) and at the best one, the wall time, where its files are and the command that draws its figure.
    summary: run_summary's dict."""
    ev = summary.get("evals") or [{"step": 0, "eval": {}}]
    a, b, best = ev[0]["eval"], ev[-1]["eval"], summary.get("best") or {}
    keys = [k for k in b if k not in ("counts", "train_panel_sampled") and not k.endswith("_score")]
    parts = [f"{eval_label(k)} {100 * a[k]:.1f}% -> {100 * b[k]:.1f}%" +
             (f" (best {100 * best[k]['value']:.1f}% at {best[k]['step']})" if k in best else "")
             for k in keys if a.get(k) is not None and b.get(k) is not None]
    wall = summary.get("wall_s")
    return (f"[done] hint-free success, step {ev[0]['step']} -> {ev[-1]['step']}: "
            + (" | ".join(parts) or "no eval")
            + (f" | wall {wall / 60:.1f} min" if wall else "") + "\n"
            f"[done] files: {out_dir}/ (log.jsonl, summary.json, config.json, transcripts/, ckpt_*)  "
            f"figure: python eval.py dynamics {out_dir} --out {os.path.join(out_dir, 'dynamics.png')}")


def env_label(cfg):
    """'alfworld', 'webshop' (the official environment) or 'webshop-lite':
    lite numbers are never WebShop's."""
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
    """The command-line flags a run was started with, less seed/out_dir/resume and the preset (the table's
    header names it): what makes it this method."""
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


TABLE_SECTIONS = [("Tables 1-2: main comparison", ("main", "released", "reference")),
                  ("Table 3: ablations", ("ablations",)),
                  ("Table 8: clusters (K = 3 is g2)", ("clusters",)), ("SFT baselines", ("sft",)),
                  ("Table 1's Aux-RL row: RLVMR and GRPO from its cold start", ("aux_rl",)),
                  ("WebShop (Tables 1-2)", ("webshop",)), ("Hint sources", ("hints",)),
                  ("Beyond the paper", ("beyond",))]  # the paper's tables, over config.METHODS' groups


def paper_tables():
    """[(section title, [method names])] in config.METHODS' order;
    WebShop's methods (ws_*) in its own section."""
    def section(name, group):
        return next(title for title, groups in TABLE_SECTIONS
                    if ("webshop" if name.startswith("ws_") else group) in groups)
    return [(title, [n for n, (g, _) in METHODS.items() if section(n, g) == title])
            for title, _ in TABLE_SECTIONS]


def table(runs, brief=False):
    """One row per method (run name), columns = final hint-free success and cost, mean ± std over seeds; each
    row gives the flags it ran with and the commits. Never mixes presets, game sets, environments or task
    types: it says so in a first line and makes one table each. A setting evaluated on held-out test_* splits
    gets the paper's Tables 1-3 instead (plumbing/tables.py; brief: its one summary table)."""
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
    ci_note = ("\n[lo–hi]: 95 % Wilson interval of the row's final-eval games pooled over its seeds. "
               "Every seed plays the same games, so it covers their binomial noise only, "
               "not seed-to-seed spread. Runs logged before success counts were have none.")
    for (env, preset, data), ss in groups.items():
        rows = collections.defaultdict(list)
        for s in ss:
            rows[run_name(s["run"])].append(s)
        part = {n: t for t, names in paper_tables() for n in names}
        order = {n: (i, j) for i, (_, names) in enumerate(paper_tables()) for j, n in enumerate(names)}
        sets = [k for k in ("train_panel", "train_panel_sampled", "val", "val_sampled", "train_panel_score",
                            "val_score")
                if any(k in s["final"] for s in ss)]
        # the paper presets' splits and the authors' draw: the last evaluation and the best one, side by side
        # (the paper may report either); sampled (T = 0.4 there) first, then greedy
        named = sorted({k for s in ss for k in s["final"] if k.startswith(("valid_", "authors_"))},
                       key=lambda k: (k.startswith("authors_"), k.replace("_sampled", ""),
                                      not k.endswith("_sampled")))
        sets += [(k, when) for k in named for when in ("last", "best")]
        out.append(f"\n**{env} / preset {preset} / {data}**\n")
        if any(k.startswith("test_") for s in ss for k in s["final"]):  # held-out splits: the paper's shape
            out.append(regime_tables({n: rows[n] for n in sorted(rows, key=lambda n: order.get(n, (99, 0)))},
                                     brief))
            continue
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
                     mean_std([100 * r["final"][k[0]] for r in rs if k[0] in r["final"]])
                     if isinstance(k, tuple) else
                     mean_std([100 * r["final"][k] for r in rs if k in r["final"]]) + pooled_ci(rs, k)
                     for k in sets]
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
    """A table column: 'val %', 'val score', or ('valid_seen_sampled', 'best') ->
    'valid_seen_sampled % best'."""
    if isinstance(k, tuple):
        return f"{k[0]} % {k[1]}"
    return k[:-6] + " score" if k.endswith("_score") else f"{k} %"


def pooled_ci(rs, k, task_type=None):
    """' [lo–hi]' (%): the 95 % Wilson interval of set k's final-eval games pooled over the runs rs, or with
    task_type, 'p % [lo–hi] (won / n)' for that type's games; '' when a run has no counts (logged before
    them)."""
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

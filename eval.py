"""Hint-free evaluation of a policy on ALFWorld games (greedy, no expert prefix), per task type.

    python eval.py --model runs/cpu/ckpt_000040 --eval_split valid_unseen [--eval_games 48]
    python eval.py --preset paper --model runs/paper/ckpt_000200
    python eval.py --plot runs/cpu runs/cpu_grpo --out docs/cpu_demo.png   # curves + a markdown table from log.jsonl

`evaluate()` is what train.py calls every eval_every steps. NOT BUILT YET: the paper's diagnostic protocol
(SPEC §6: success p_i(d) on a 0.1 depth grid, 32 rollouts each, Gaussian fit of p(1-p) over d - d*_i) and the
mismatch-vs-budget panel; `--diagnostic` says so and exits non-zero.
"""
import collections
import dataclasses
import json
import os
import sys

from rollout import rollout


def evaluate(engine, pool, tok, tasks, cfg, seed=0, temperature=0.0):
    """Hint-free, one episode per task, greedy (temperature 0) or sampled. Returns {"success", "n", "won",
    "per_type": {type: success}, "invalid", "out": the rollout output (rows + episodes, for transcripts)}."""
    if not tasks:
        return {"success": float("nan"), "n": 0, "won": 0, "per_type": {}, "invalid": 0.0, "out": None}
    ecfg = dataclasses.replace(cfg, temperature=temperature)
    out = rollout(engine, pool, tok, [{"task": t, "n": 0, "R": 1} for t in tasks], ecfg, seed)
    by = collections.defaultdict(list)
    for e, t in zip(out["episodes"], tasks):
        by[t["task_type"]].append(e["won"])
    won = [e["won"] for e in out["episodes"]]
    return {"success": sum(won) / len(won), "n": len(won), "won": sum(won),
            "per_type": {k: sum(v) / len(v) for k, v in sorted(by.items())},
            "invalid": out["stats"]["invalid"] / max(out["stats"]["env_steps"], 1), "out": out}


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


def curves(run):
    """{"val": [(step, success)], "train_panel": [...], "train_batch": [(step, batch success)]} from log.jsonl."""
    out = collections.defaultdict(list)
    for line in open(os.path.join(run, "log.jsonl")):
        r = json.loads(line)
        for k, v in r.get("eval", {}).items():
            out[k].append((r["step"], v))
        if r.get("success") is not None:
            out["train_batch"].append((r["step"], r["success"]))
    return out


def plot(runs, path):
    """Hint-free success curves of several runs (one panel per eval set), and a markdown table to stdout."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = {r: curves(r) for r in runs}
    sets = ["train_panel", "val", "train_batch"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    titles = {"train_panel": "training panel (hint-free)", "val": "validation (hint-free)",
              "train_batch": "training batch (at the scheduled depth)"}
    for ax, k in zip(axes, sets):
        for r, c in data.items():
            if c.get(k):
                x, y = zip(*c[k])
                ax.plot(x, [100 * v for v in y], marker="o" if k != "train_batch" else None, label=r)
        ax.set_title(titles[k])
        ax.set_xlabel("step")
        ax.set_ylabel("success %")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    steps = sorted({s for c in data.values() for s, _ in c.get("val", [])})
    print("| run | set | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    for r, c in data.items():
        for k in ("train_panel", "val"):
            d = dict(c.get(k, []))
            print(f"| {r} | {k} | " + " | ".join(f"{100 * d[s]:.1f}" if s in d else "" for s in steps) + " |")
    print(f"(plot: {path})")


def main():
    from config import get_config
    if "--plot" in sys.argv:
        args = sys.argv[sys.argv.index("--plot") + 1:]
        out = args[args.index("--out") + 1] if "--out" in args else "docs/curves.png"
        return plot([a for a in args if not a.startswith("--") and a != out], out)
    if "--diagnostic" in sys.argv:
        sys.exit("eval.py --diagnostic: the SPEC §6 diagnostic protocol is not built yet")
    cfg = get_config(description=__doc__)
    from envs import EnvPool, load_tasks
    tasks = load_tasks(cfg.eval_split, cfg.games, task_types=cfg.task_types.split(",") if cfg.task_types else None)
    tasks = tasks[:cfg.eval_games] if cfg.eval_games else tasks
    pool = EnvPool(cfg.num_workers)
    import torch
    from transformers import AutoTokenizer
    from rollout import make_engine
    from tiny import resolve_model
    path = resolve_model(cfg)
    device = "cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
    tok = AutoTokenizer.from_pretrained(path)
    engine = make_engine(cfg, path, tok, device, cfg.seed)
    r = evaluate(engine, pool, tok, tasks, cfg, cfg.seed)
    pool.close()
    print(f"{cfg.eval_split}: success {100 * r['success']:.1f}% ({r['won']}/{r['n']}), invalid steps "
          f"{100 * r['invalid']:.1f}%")
    for k, v in r["per_type"].items():
        print(f"  {k:32s} {100 * v:5.1f}%")


if __name__ == "__main__":
    main()

"""Hint-free evaluation: the panel (every game once) and the authors' protocol (their seeded draw), in the
loop and from the command line; the CLI also runs the diagnostic (diagnose.py) and the tables and figure
(plumbing/report.py).

Contract. in_loop_eval(engine, pool, tok, sets, cfg, step, ...) -> {set name: success, "counts"}: hint-free
episodes (no prefix, no hint text), greedy or sampled with seeds fixed by the run's seed, the set and the
step (never by what ran before); write_transcripts prints the actions as played.

    python eval.py panel --model CKPT [--split valid_unseen] [--games builtin|official] [--seeds 0 1 2] \
        [--decode greedy|sampled]
    # their draw, seed s = validation s
    python eval.py panel --model CKPT --eval_protocol authors --split valid_seen
    # WebShop: success and score (100 x mean reward)
    python eval.py panel --model CKPT --env webshop --split eval
    python eval.py diagnose --model CKPT [--tasks 8] [--rollouts 32] [--grid 0.1] [--checkpoints RUN_DIR]
    python eval.py dynamics RUN_DIR... [--out runs/eval/dynamics.png]
    python eval.py table [--brief] RUN_DIR...

A checkpoint is evaluated under the config it was trained with (its config.json.run); flags override it, and
--preset/any train.py flag works here too. `evaluate()` is also what train.py calls in the loop, so in-loop
and offline numbers agree for the same checkpoint, seed and decoding.
"""
import argparse
import collections
import dataclasses
import glob
import json
import os
import sys

import numpy as np

from plumbing.report import dynamics, env_label, table, wilson
from rollout import Reply, rollout


def evaluate(engine, pool, tok, tasks, cfg, seed=0, temperature=0.0, reply=None, keys=None):
    """Hint-free, one episode per task, greedy (temperature 0) or sampled; reply: rollout.Reply (None:
    Reply(cfg)); keys: per-task sampling keys (None: the engine's stream from `seed`). -> {"success", "n",
    "won", "score" (100 x mean raw reward: WebShop's score), "per_type": {type: success}, "per_type_won":
    {type: [won, n]}, "invalid", "out": the rollout output (rows + episodes)}."""
    if not tasks:
        return {"success": float("nan"), "n": 0, "won": 0, "score": float("nan"), "per_type": {},
                "per_type_won": {}, "invalid": 0.0, "out": None}
    ecfg = dataclasses.replace(cfg, temperature=temperature)
    out = rollout(engine, pool, tok, [{"task": t, "n": 0, "R": 1, "prefix": [], "key": k}
                                      for t, k in zip(tasks, keys or [None] * len(tasks))], ecfg, seed, reply)
    by = collections.defaultdict(list)
    for e, t in zip(out["episodes"], tasks):
        by[t["task_type"]].append(int(e["won"]))
    won = [e["won"] for e in out["episodes"]]
    return {"success": sum(won) / len(won), "n": len(won), "won": sum(won),
            "score": 100 * float(np.mean([e["score"] for e in out["episodes"]])),
            "per_type": {k: sum(v) / len(v) for k, v in sorted(by.items())},
            "per_type_won": {k: [sum(v), len(v)] for k, v in sorted(by.items())},
            "invalid": out["stats"]["invalid"] / max(out["stats"]["env_steps"], 1), "out": out}


def eval_tasks(cfg, train_tasks, verbose=True):
    """The hint-free evaluation's games -> (val_sets: [(logged name, tasks)] per --eval_split split, cut to
    --eval_games (-1: none), the training panel: --train_panel training tasks (a fixed draw), n_eval: the
    most episodes one evaluation plays at once)."""
    from plumbing.tasks import tasks_for
    cut = lambda ts: [] if cfg.eval_games < 0 else ts[:cfg.eval_games] if cfg.eval_games else ts  # noqa: E731
    val_sets = [(name, cut(tasks_for(cfg, split, verbose=verbose))) for name, split in eval_splits(cfg)]
    order = np.random.default_rng(1234).permutation(len(train_tasks))  # a fixed draw, the same every run
    panel = [train_tasks[i] for i in order[:cfg.train_panel]]
    n_eval = max([len(ts) for _, ts in val_sets] + [len(panel)]
                 + [cfg.authors_episodes] * (cfg.eval_protocol != "panel"))
    return val_sets, panel, n_eval


def eval_splits(cfg):
    """--eval_split's splits with their logged names: one split is 'val'; several keep their names."""
    splits = [x.strip() for x in cfg.eval_split.split(",") if x.strip()]
    return [("val" if len(splits) == 1 else sp, sp) for sp in splits]


def evals_due(cfg, step):
    """-> (panel due, authors' draw due) before step's training: both at 0 and at cfg.steps (the end), else
    every --eval_every / --authors_every steps (their trainer.test_freq with val_before_train)."""
    edge = step == 0 or step == cfg.steps
    panel = cfg.eval_protocol in ("panel", "both") and (
        edge or bool(cfg.eval_every and step % cfg.eval_every == 0))
    authors = cfg.eval_protocol in ("authors", "both") and (edge or step % cfg.authors_every == 0)
    return panel, authors


def authors_draw(n_tasks, k, env, episodes=128, seed=1000):
    """Task positions of the authors' validation number k (k = 0: before training), one per episode, repeats
    possible; their 128 env workers, worker i seeded 1000 + i [ZJU-REAL/Agent-G2
    agent_system/environments/env_manager.py, make_envs; .../alfworld/envs.py, AlfworldWorker]. ALFWorld:
    worker i shuffles the games (RandomState(1000 + i)) and reshuffles after each pass: validation k is the
    k-th game of every stream (TextWorld's TextworldBatchGymEnv.seed, textworld/gym/envs/utils.py
    shuffled_cycle). WebShop: one RandomState(1000) draws 128 distinct goals per validation: validation k is
    its (k+1)-th draw (.../webshop/envs.py, WebshopMultiProcessEnv.reset)."""
    if env == "webshop":
        rng = np.random.RandomState(seed)
        for _ in range(k + 1):
            pick = rng.choice(n_tasks, size=episodes, replace=False)
        return pick.tolist()
    out = []
    for i in range(episodes):
        rng = np.random.RandomState(seed + i)
        order = list(range(n_tasks))
        for _ in range(k // n_tasks + 1):  # the first shuffle, then one per completed pass (in place)
            rng.shuffle(order)
        out.append(order[k % n_tasks])
    return out


def authors_index(step, every):
    """How many authors' evaluations (at 0, every, 2 every, ..., the end) came before the one at `step`."""
    return 0 if step == 0 else (step - 1) // every + 1


def eval_sets(cfg, step, val, panel):
    """The evaluations due at `step`: [(name, tasks, [(suffix, temperature)])]; val: [(name, tasks)] per eval
    split, panel: the fixed training tasks. The panel plays every task once, greedy and sampled; the authors'
    protocol their draw of the first split's tasks, sampled (their val_kwargs: do_sample, 0.4)."""
    do_panel, do_authors = evals_due(cfg, step)
    both = [("", 0.0), ("_sampled", cfg.eval_temperature)]
    sets = [(name, tasks, both)
            for name, tasks in val + [("train_panel", panel)] if tasks] if do_panel else []
    if do_authors and val and val[0][1]:
        split, tasks = eval_splits(cfg)[0][1], val[0][1]
        pick = authors_draw(len(tasks), authors_index(step, cfg.authors_every), cfg.env, cfg.authors_episodes)
        sets.append((f"authors_{split}", [tasks[i] for i in pick], [("_sampled", cfg.eval_temperature)]))
    return sets


def in_loop_eval(engine, pool, tok, sets, cfg, step, rank=0, world=1, gather=lambda x: [x], reply=None):
    """train.py's evaluation: each of eval_sets' sets at each of its decodings, sharded over ranks (gather:
    all_gather_object); rank 0 writes transcripts to out_dir/transcripts/. -> {"val": success, "val_sampled":
    ..., "counts": {"val": {"won", "n", "per_type": {type: [won, n]}}, ...}} (for Wilson intervals)."""
    res, counts = {}, {}
    for name, tasks, decodes in sets:
        for suffix, temp in decodes:
            mine = tasks[rank::world]
            seed = (2 * 10**6 if name.startswith("authors_") else 10**6) + step
            keys = [("eval", cfg.seed, step, name + suffix, rank + world * j) for j in range(len(mine))]
            r = evaluate(engine, pool, tok, mine, cfg, seed, temp, reply, keys) if mine else None
            if r and rank == 0:
                write_transcripts(os.path.join(cfg.out_dir, "transcripts",
                                               f"step{step:06d}_{name}{suffix}.txt"),
                                  r["out"], tok, header=f"step {step} {name}{suffix} temperature {temp}")
            got = gather({"won": r["won"], "n": r["n"], "per_type": r["per_type_won"],
                          "reward": sum(e["score"] for e in r["out"]["episodes"])}
                         if r else {"won": 0, "n": 0, "reward": 0.0, "per_type": {}})
            won, n = sum(x["won"] for x in got), sum(x["n"] for x in got)
            types = sorted({k for x in got for k in x["per_type"]})
            counts[name + suffix] = {"won": won, "n": n, "per_type": {
                k: [sum(x["per_type"].get(k, [0, 0])[i] for x in got) for i in (0, 1)] for k in types}}
            res[name + suffix] = won / max(n, 1)
            if cfg.env == "webshop":  # WebShop's second metric, mean raw reward (the paper's score / 100)
                res[name + suffix + "_score"] = sum(x["reward"] for x in got) / max(n, 1)
    return {**res, "counts": counts}


def write_transcripts(path, out, tok, k=3, header=""):
    """The first k episodes of a rollout output, decoded turn by turn (prompt, reply, the action played as
    the rollout read it, valid): the first thing to read when a number looks wrong."""
    lines = [header] if header else []
    for e in out["episodes"][:k]:
        lines.append(f"=== episode {e['eid']} task {e['task_id']} prefix {e['n']} won {e['won']} "
                     f"reward {e['reward']} steps {e['steps']} invalid {e['invalid']} error {e['error']}")
        for r in [r for r in out["rows"] if r["eid"] == e["eid"]]:
            lines += [f"--- turn {r['t']} prompt:", tok.decode(r["prompt_ids"], skip_special_tokens=False),
                      f"--- reply: {r.get('text', tok.decode(r['response_ids']))!r}",
                      f"--- action: {r.get('action', '')!r} valid {r['valid']}"]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# panel: every game of a split, once per seed, hint-free
# ---------------------------------------------------------------------------------------------
def panel(engine, pool, tok, tasks, cfg, seeds, temperature, path, protocol="panel", reply=None):
    """protocol "panel": play every task once per seed; "authors": per seed s, the authors' validation number
    s (authors_draw: --authors_episodes episodes, repeats possible; s = 0 is the one before training). Per
    seed: overall and per-type success with Wilson intervals, the ids of the tasks won; across seeds: mean
    and std. Results are written to `path` after each seed, and a rerun skips the seeds already there."""
    res = json.load(open(path)) if os.path.exists(path) else {}
    key = {"tasks": [t["id"] for t in tasks], "temperature": temperature, "model": cfg.model,
           "protocol": protocol}
    if res.get("key") != key:
        res = {"key": key, "seeds": {}}
    for s in seeds:
        if str(s) in res["seeds"]:
            print(f"[panel] seed {s}: done already ({path})")
            continue
        played = tasks if protocol == "panel" else [tasks[i] for i in authors_draw(len(tasks), s, cfg.env,
                                                                                   cfg.authors_episodes)]
        r = evaluate(engine, pool, tok, played, cfg, seed=s, temperature=temperature, reply=reply,
                     keys=[("panel", s, protocol, j) for j in range(len(played))])
        res["seeds"][str(s)] = {"won": r["won"], "n": r["n"], "success": r["success"],
                                "ci95": wilson(r["won"], r["n"]), "score": r["score"],
                                "per_type": {k: {"won": w, "n": m, "success": w / m, "ci95": wilson(w, m)}
                                             for k, (w, m) in r["per_type_won"].items()},
                                "invalid": r["invalid"],
                                "won_ids": [t["id"] for t, e in zip(played, r["out"]["episodes"])
                                            if e["won"]]}
        json.dump(res, open(path + ".tmp", "w"), indent=1)
        os.replace(path + ".tmp", path)
    per = [res["seeds"][str(s)] for s in seeds]
    res["mean"] = float(np.mean([p["success"] for p in per]))
    res["std"] = float(np.std([p["success"] for p in per], ddof=1)) if len(per) > 1 else 0.0  # sample std
    res["score_mean"] = float(np.mean([p["score"] for p in per]))
    res["per_type_mean"] = {k: float(np.mean([p["per_type"][k]["success"]
                                              for p in per if k in p["per_type"]]))
                            for k in sorted({k for p in per for k in p["per_type"]})}
    json.dump(res, open(path, "w"), indent=1)
    return res


def main():
    from config import get_config
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd in ("dynamics", "table"):
        args = sys.argv[2:]
        if {"-h", "--help"} & set(args):  # their usage, as panel's and diagnose's --help print theirs
            return print("usage: python eval.py table RUN_OR_FOLDER... [--brief]  (a Markdown table of the "
                         "runs' final success)" if cmd == "table" else
                         "usage: python eval.py dynamics RUN... [--out FILE.png]  (the runs' training "
                         "dynamics figure)")
        if cmd == "table":  # a directory without a run in it stands for every run below it
            is_run = lambda a: any(os.path.exists(os.path.join(a, f))  # noqa
                                   for f in ("config.json", "summary.json"))
            runs = [r for a in args if not a.startswith("--") for r in ([a] if is_run(a) else sorted(
                os.path.dirname(p)
                for p in glob.glob(os.path.join(a, "**", "summary.json"), recursive=True)))]
            if not runs:
                from config import fail
                fail(f"eval.py table: no run under {' '.join(a for a in args if a != '--brief')} (a run "
                     "folder holds config.json or summary.json)")
            return print(table(runs, brief="--brief" in args))
        out = args[args.index("--out") + 1] if "--out" in args else "runs/eval/dynamics.png"
        return dynamics([a for a in args if not a.startswith("--") and a != out], out)
    if cmd in ("", "-h", "--help"):
        return print(__doc__ + "\nsubcommands: panel | diagnose | dynamics | table  "
                               "(`python eval.py panel --help`)")
    if cmd not in ("panel", "diagnose"):
        sys.exit(f"error: unknown subcommand {cmd!r}: expected panel | diagnose | dynamics | table")

    def extra(p):
        p.add_argument("--split", default="valid_unseen", help="panel: split to play")
        p.add_argument("--seeds", type=int, nargs="+", default=[0],
                       help="panel: one pass over the split per seed")
        p.add_argument("--decode", default="greedy", choices=["greedy", "sampled"],
                       help="panel: greedy, or sampled at --eval_temperature "
                            "(--eval_protocol authors: sampled)")
        p.add_argument("--tasks", type=int, default=8, help="diagnose: training tasks in the fixed sample")
        p.add_argument("--rollouts", type=int, default=32, help="diagnose: rollouts per (task, depth)")
        p.add_argument("--grid", type=float, default=0.1, help="diagnose: depth-ratio grid step")
        p.add_argument("--draws", type=int, default=50,
                       help="diagnose: repetitions of each scheduler's replay")
        p.add_argument("--checkpoints", default="", help="diagnose: every checkpoint of this run directory")
        p.add_argument("--out", default="", help="output: JSON path (panel) or directory (diagnose); "
                       "default under runs/eval/<model name>/, never inside a checkpoint")
    argv = sys.argv[2:]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model", default="")
    pre.add_argument("--checkpoints", default="")
    known, _ = pre.parse_known_args(argv)
    if known.checkpoints:
        from plumbing import ckpt
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
    from envs import EnvPool, env_spec
    from plumbing.tasks import tasks_for, train_subset
    from rollout import make_engine, seed_all
    from plumbing.tiny import resolve_model
    seed_all(cfg.seed)
    path = resolve_model(cfg)
    device = "cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # a hub id that is not reachable (offline, a typo)
        model_error(cfg.model, e)
    pool = EnvPool(cfg.num_workers, env_spec(cfg))
    engine = make_engine(cfg, path, tok, device, cfg.seed)
    # never into the checkpoint
    runs_dir = os.path.join("runs", "eval", os.path.basename(os.path.normpath(path)))
    if cmd == "panel":
        tasks = tasks_for(cfg, args.split)
        authors = cfg.eval_protocol == "authors"  # their draw, sampled (their val_kwargs)
        temp = cfg.eval_temperature if authors or args.decode == "sampled" else 0.0
        dec = "greedy" if temp == 0 else f"sampled at T={temp:g}"
        out = args.out or os.path.join(runs_dir, f"{'authors' if authors else 'panel'}_{args.split}_"
                                                 f"{'greedy' if temp == 0 else f't{temp:g}'}.json")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        r = panel(engine, pool, tok, tasks, cfg, args.seeds, temp, out, "authors" if authors else "panel",
                  Reply(cfg))
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
    from tools.diagnose import diagnose, dstar_over_steps
    train_tasks = train_subset(tasks_for(cfg, cfg.train_split), cfg.train_games)
    sample = [train_tasks[i]
              for i in sorted(np.random.default_rng(4321).permutation(len(train_tasks))[:args.tasks])]
    results = []
    outdir = args.out or os.path.join(known.checkpoints or runs_dir, "diagnose")
    for ck in ckpts or [path]:
        if ckpts:
            from transformers import AutoModelForCausalLM
            engine.load_weights(AutoModelForCausalLM.from_pretrained(
                ck, dtype=torch.float32 if device == "cpu" else torch.bfloat16).state_dict().items())
        args.out = os.path.join(outdir, os.path.basename(ck)) if ckpts else outdir
        results.append(diagnose(engine, pool, tok, sample, train_tasks, cfg, args, ck))
    pool.close()
    if ckpts:
        dstar_over_steps(results, os.path.join(outdir, "dstar_vs_step.png"))
        print(f"(d* against step: {os.path.join(outdir, 'dstar_vs_step.png')})")


if __name__ == "__main__":
    main()

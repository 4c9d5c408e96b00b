"""Hint-free evaluation of a policy on ALFWorld games (greedy, no expert prefix), per task type.

    python eval.py --model runs/cpu/ckpt_000040 --eval_split valid_unseen [--eval_games 48]
    python eval.py --preset paper --model runs/paper/ckpt_000200

`evaluate()` is what train.py calls every eval_every steps. NOT BUILT YET: the paper's diagnostic protocol
(SPEC §6: success p_i(d) on a 0.1 depth grid, 32 rollouts each, Gaussian fit of p(1-p) over d - d*_i) and the
mismatch-vs-budget panel; `--diagnostic` says so and exits non-zero.
"""
import collections
import dataclasses
import sys

from rollout import rollout


def evaluate(engine, pool, tok, tasks, cfg, seed=0, tag="eval"):
    """Greedy, hint-free, one episode per task. Returns {"success", "n", "per_type": {type: success}}."""
    if not tasks:
        return {"success": float("nan"), "n": 0, "per_type": {}}
    ecfg = dataclasses.replace(cfg, temperature=0.0)
    out = rollout(engine, pool, tok, [{"task": t, "n": 0, "R": 1} for t in tasks], ecfg, seed)
    by = collections.defaultdict(list)
    for e, t in zip(out["episodes"], tasks):
        by[t["task_type"]].append(e["won"])
    won = [e["won"] for e in out["episodes"]]
    return {"success": sum(won) / len(won), "n": len(won), "won": sum(won),
            "per_type": {k: sum(v) / len(v) for k, v in sorted(by.items())},
            "invalid": out["stats"]["invalid"] / max(out["stats"]["env_steps"], 1)}


def main():
    from config import get_config
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

"""Benchmarks: each prints a table (and --json PATH writes the same numbers).

    python -m tools.bench sched [--json out.json]  # every scheduler on a simulated task population, 5 seeds
    python -m tools.bench env                      # ALFWorld engine + WebShop-lite:
                                                   # reset/step, prefix replay, pool
    python -m tools.bench rollout                  # tokens/s HF vs vLLM, weight-sync time, rollout time split
    python -m tools.bench sync                     # the sync check's |d log p| per engine and trainer dtype
    python -m tools.bench step [--preset P] [--tree DIR]  # a training step's time split:
                                                   # median, min - max over the steps
    python -m tools.bench gpu [--cpu]              # one-shot GPU check (gpu_check.sh):
                                                   # engine, log-probs, sync, train
"""
import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

# ============================================================================================
# sched: a simulated task population (no model, no environment)
# ============================================================================================
# The model, fixed before any scheduler was run through it and not tuned toward any method:
# - N = 64 tasks in three length groups like ALFWorld's (L in 3-6, 6-10, 10-15 expert actions).
# - Task i succeeds from depth ratio r with p_i(r) = sigmoid((r - d*_i) / s), s = 0.13, so its information
#   p(1-p) over r - d*_i is the band the paper measured (a Gaussian fit gives sigma ~ 0.22).
# - d*_i starts at 0.35 / 0.55 / 0.75 by length group (+ N(0, 0.08)): longer tasks need deeper hints.
# - Learning is GRPO's: a group of R draws teaches only when it is mixed. After training on task i,
#   d*_i -= ETA_SELF * 4 p̂(1-p̂) (empirical group variance), and every task gets
#   d*_j -= ETA_SHARED * mean of that signal over the batch (one shared policy). So a task learns faster when
#   it is trained in band, and the policy drifts toward hint-free success.
# - Hint-free success = mean_i p_i(0). "steps to 90%" is the first step where it reaches 0.9 (T+ if never).
# - Probe methods draw their probe groups from the same curves; only the chosen group is trained on.
# Limits: no aux loss, no forgetting, no per-step credit, a fixed curve shape. It measures how each
# rule places groups relative to each task's band, and what that does under this simple learning
# rule; nothing more.
S_CURVE, ETA_SELF, ETA_SHARED, N_TASKS, T_SIM = 0.13, 0.04, 0.004, 64, 200
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


def encode_prompt(tok, message, max_tokens):
    """rollout.chat_ids of a message that keep their last max_tokens tokens (the benchmarks' prompts).
    -> (ids, truncated?)"""
    from rollout import chat_ids
    ids = chat_ids(tok, message)
    return (ids[-max_tokens:], True) if len(ids) > max_tokens else (ids, False)


def alfworld_population(rng):
    """Three length groups like ALFWorld's; d*_i by group (0.35 / 0.55 / 0.75) + N(0, 0.08): longer tasks need
    deeper hints. -> (L [N], d* [N])."""
    grp = rng.integers(0, 3, N_TASKS)
    L = np.array([rng.integers(*[(3, 7), (6, 11), (10, 16)][g]) for g in grp])
    return L, np.array([0.35, 0.55, 0.75])[grp] + rng.normal(0, 0.08, N_TASKS)


def bimodal_population(rng):
    """alfworld_population with each length group split in two: half its tasks need 0.2 less depth, half 0.2
    more (an easy and a hard half in one cluster: the case for a two-component mixture, g2_mix)."""
    L, dstar = alfworld_population(rng)
    return L, dstar + np.where(rng.random(N_TASKS) < 0.5, -0.2, 0.2)


POPULATIONS = {"alfworld": alfworld_population, "bimodal": bimodal_population}  # bench.py sched --population


def simulate(overrides, seed, B=16, R=8, population="alfworld"):
    from config import load_preset, Config
    from scheduler import make_rule
    cfg = dataclasses.replace(Config(**{**dataclasses.asdict(Config()), **load_preset("paper")}),
                              steps=T_SIM, batch_tasks=B, group_size=R, max_steps=50, **overrides)
    rng = np.random.default_rng(seed)
    L, dstar = POPULATIONS[population](rng)
    ids = [f"t{i}" for i in range(N_TASKS)]
    sched = make_rule(cfg, ids, L.tolist(), seed)
    p_of = lambda i, n: 1 / (1 + np.exp(-(n / L[i] - dstar[i]) / S_CURVE))  # noqa: E731
    band = under = over = groups = rollouts = 0
    early = np.zeros(3)  # in band / under / over over the first 50 steps (the paper reports step 50)
    hit = None
    for step in range(T_SIM):
        batch = rng.choice(N_TASKS, B, replace=False)
        probe = lambda pairs: [int(rng.binomial(R, p_of(batch[i], n))) for i, n in pairs]  # noqa: E731
        memo = {}

        def probe_memo(pairs):  # the chosen probe's draw is the group that is trained on
            out = probe(pairs)
            memo.update({(i, n): s for (i, n), s in zip(pairs, out)})
            return out
        plan = sched.depths([{"id": ids[i], "L": int(L[i])} for i in batch], step, probe_memo)
        p_true = np.array([p_of(i, n) for i, n in zip(batch, plan["n"])])
        succ = np.array([memo[(j, n)] if (j, n) in memo else rng.binomial(R, p)
                         for j, (n, p) in enumerate(zip(plan["n"], p_true))])
        band += np.sum((p_true >= 0.4) & (p_true <= 0.6))
        under += np.sum(p_true < 0.4)
        over += np.sum(p_true > 0.6)
        groups += B
        if step < 50:
            early += [np.sum((p_true >= 0.4) & (p_true <= 0.6)), np.sum(p_true < 0.4), np.sum(p_true > 0.6)]
        rollouts += B * R + plan["probe_rollouts"]
        p_hat = succ / R
        info = 4 * p_hat * (1 - p_hat)
        dstar[batch] -= ETA_SELF * info
        dstar -= ETA_SHARED * info.mean()
        sched.update([ids[i] for i in batch], p_hat.tolist(),
                     [[1] * int(s) + [0] * (R - int(s)) for s in succ])
        if hit is None and np.mean(1 / (1 + np.exp(dstar / S_CURVE))) >= 0.9:
            hit = step + 1
    e = early / (min(T_SIM, 50) * B)
    return {"band50": e[0], "under50": e[1], "over50": e[2], "in_band": band / groups,
            "under": under / groups, "over": over / groups, "rollouts_per_task": rollouts / groups / R,
            "steps_to_90": hit, "final_hint_free": float(np.mean(1 / (1 + np.exp(dstar / S_CURVE))))}


def only_rows(args):
    """--only NAME[,NAME...] (+ config flags such as --ucb_c 0.2): those registered rules beside
    Agent-G² (g2)."""
    import config
    from config import rule_names
    ov, extra = {}, list(args.extra)
    while extra:
        k = extra.pop(0)
        if not k.startswith("--") or not extra or k[2:] not in config.Config.__dataclass_fields__:
            raise SystemExit(f"bench.py sched --only: expected --<config flag> <value>, got {k!r}")
        default, v = getattr(config.Config(), k[2:]), extra.pop(0)
        ov[k[2:]] = v in ("1", "true", "True") if isinstance(default, bool) else type(default)(v)
    rows = [("g2", dict())]
    for name in args.only.split(","):
        if name not in rule_names():
            raise SystemExit(f"bench.py sched --only: no scheduler {name!r}; "
                             f"registered: {', '.join(rule_names())}")
        rows.append((name + "".join(f" {k}={v}" for k, v in ov.items()), dict(scheduler=name, **ov)))
    return rows


def bench_sched(args):
    """Every method of config.METHODS that differs only in its depth rule (config.scheduler_methods), then the
    rollout-budget sweep (config.BUDGET), on the simulated population --population."""
    from config import BUDGET, flag_values, scheduler_methods
    t0 = time.time()
    seeds = list(range(args.seeds))
    rows, budget = {}, {}
    for label, ov in only_rows(args) if args.only else scheduler_methods():
        rows[label] = [simulate(ov, s, population=args.population) for s in seeds]
    for label, flags in [] if args.only else BUDGET.items():
        budget[label] = [simulate(flag_values(flags), s, population=args.population) for s in seeds]

    def ms(runs, k, scale=1.0, fmt="{:5.1f}"):
        x = np.array([np.nan if r[k] is None else r[k] * scale for r in runs], dtype=float)
        miss = np.isnan(x).sum()
        if miss == len(x):
            return f">{T_SIM}".rjust(13)
        s = (fmt + " ± " + fmt).format(np.nanmean(x), np.nanstd(x))
        return s + (f" ({miss}>{T_SIM})" if miss else "")
    print(f"bench.py sched: {N_TASKS} simulated tasks ({args.population} population), |B|=16, R=8, "
          f"T={T_SIM}, {len(seeds)} seeds (mean ± std)")
    print(f"{'scheduler':26s} {'band@<50 %':>14s} {'under@<50 %':>14s} {'over@<50 %':>14s} "
          f"{'in band % (all)':>16s} {'rollouts/R':>14s} {'steps to 90%':>16s} {'final hint-free %':>18s}")
    for label, runs in rows.items():
        print(f"{label:26s} {ms(runs, 'band50', 100):>14s} {ms(runs, 'under50', 100):>14s} "
              f"{ms(runs, 'over50', 100):>14s} {ms(runs, 'in_band', 100):>16s} "
              f"{ms(runs, 'rollouts_per_task', 1, '{:5.2f}'):>14s} "
              f"{ms(runs, 'steps_to_90', 1, '{:5.0f}'):>16s} {ms(runs, 'final_hint_free', 100):>18s}")
    if budget:
        print("\nmismatch (share of groups outside [0.4, 0.6], first 50 steps) against "
              "rollout budget (Figure 2b):")
        print(f"{'method':22s} {'rollouts/R':>14s} {'mismatch %':>14s}")
    for label, runs in budget.items():
        mm = [{"m": 1 - r["band50"]} for r in runs]
        print(f"{label:22s} {ms(runs, 'rollouts_per_task', 1, '{:5.2f}'):>14s} {ms(mm, 'm', 100):>14s}")
    print(f"({time.time() - t0:.0f} s)")
    if args.json:
        json.dump({"model": {"s": S_CURVE, "eta_self": ETA_SELF, "eta_shared": ETA_SHARED, "N": N_TASKS,
                             "T": T_SIM},
                   "schedulers": rows, "budget": budget}, open(args.json, "w"), indent=1)


# ============================================================================================
# env: the real engine on the built-in games
# ============================================================================================
def _stats(x):
    x = np.asarray(x) * 1000
    return f"{x.mean():7.1f} {np.percentile(x, 90):7.1f}"


def bench_env(args):
    from envs import AlfEnv, EnvPool
    from plumbing.tasks import load_tasks
    tasks = load_tasks("train")
    res = {}
    print("bench.py env: real ALFWorld engine (alfworld + TextWorld PDDL) on the built-in games, "
          "ms (mean / p90)")
    print(f"{'':34s} {'load':>15s} {'load again':>15s} {'reset':>15s} {'step':>15s}")
    rows = [("engine as shipped", False, False), ("with parse/translation caches", True, False),
            ("... and shallow text-gen contexts", True, True)]  # cumulative: each patch stays for the process
    for name, cache, shallow in rows:
        env = AlfEnv(cache_translation=cache, shallow_context=shallow)
        load, reset, step = [], [], []
        for t in tasks[:16]:
            t0 = time.time()
            env.reset(t["gamefile"])  # a new game: load + reset
            load.append(time.time() - t0)
            t0 = time.time()
            ep = env.reset(t["gamefile"])
            reset.append(time.time() - t0)
            for a in t["walkthrough"]:
                t0 = time.time()
                env.step(ep, a)
                step.append(time.time() - t0)
        again = []  # each game once more, after 15 others (a worker switches games every step)
        for t in tasks[:16]:
            t0 = time.time()
            env.reset(t["gamefile"])
            again.append(time.time() - t0)
        res[name] = {"load_ms": np.mean(load) * 1e3, "load_again_ms": np.mean(again) * 1e3,
                     "reset_ms": np.mean(reset) * 1e3, "step_ms": np.mean(step) * 1e3}
        print(f"{name:34s} {_stats(load)} {_stats(again)} {_stats(reset)} {_stats(step)}")
    print("\nexpert-prefix replay (reset + n expert steps, same game, caches on), ms:")
    env, t = AlfEnv(), max(tasks, key=lambda t: t["L"])
    env.reset(t["gamefile"])
    for n in (0, 2, 4, 8, 12, t["L"] - 1):
        ts = []
        for _ in range(3):
            t0 = time.time()
            env.reset(t["gamefile"], t["walkthrough"][:n])
            ts.append(time.time() - t0)
        res[f"prefix_{n}_ms"] = np.mean(ts) * 1e3
        print(f"  n = {n:2d}: {np.mean(ts) * 1e3:7.1f}")
    print(f"\na group's start: R = 8 episodes of one game ({t['L']} expert steps) reset after an n-step "
          "expert prefix, then one step and close; one worker, ms:")
    for n in (2, 4, 8, 12):
        row = []
        for fork in (False, True):  # R replays of the prefix | one replay, then R - 1 forks of the worker
            pool = EnvPool(1, {"env": "alfworld", "fork_prefix": fork})
            # warm: 8 engines with the game loaded
            pool.run([("reset", e, t["gamefile"], []) for e in range(8)])
            pool.run([("close", e) for e in range(8)])
            ts = []
            for _ in range(3):
                t0 = time.time()
                pool.run([("reset", e, t["gamefile"], t["walkthrough"][:n]) for e in range(8)])
                pool.run([("step", e, t["walkthrough"][n]) for e in range(8)])
                pool.run([("close", e) for e in range(8)])
                ts.append(time.time() - t0)
            pool.close()
            row.append(np.mean(ts) * 1e3)
        res[f"group_start_{n}_ms"] = {"replayed": row[0], "forked": row[1]}
        print(f"  n = {n:2d}: replayed {row[0]:7.1f}   forked {row[1]:7.1f}")
    print("\npool throughput: 32 episodes (4 tasks x 8), random admissible actions, 8 turns:")
    rng = np.random.default_rng(0)
    for w in (1, 2):
        pool = EnvPool(w)
        eids = list(range(32))
        # warm: engines created, games loaded
        pool.run([("reset", e, tasks[e // 8]["gamefile"], []) for e in eids])
        state = pool.run([("reset", e, tasks[e // 8]["gamefile"], []) for e in eids])
        t0, n = time.time(), 0
        for _ in range(8):
            state = pool.run([("step", e, s["admissible"][rng.integers(len(s["admissible"]))])
                              for e, s in zip(eids, state)])
            n += len(eids)
        dt = time.time() - t0
        rss = [int(next(l.split()[1] for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS"))) / 1024
               for p in pool.procs]
        pool.close()
        res[f"pool_{w}"] = {"steps_per_s": n / dt, "rss_mb_per_worker": float(np.mean(rss))}
        print(f"  {w} worker(s): {n / dt:6.1f} env-steps/s, RSS {np.mean(rss):.0f} MB per worker "
              f"({32 // w} engine objects per worker, each with its own 34 MB libdownward copy in $TMPDIR)")
    res["webshop-lite"] = bench_webshop()
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)


def bench_webshop(products=1000):
    """The WebShop-lite site (this repo's offline backend, not the official WebShop): build, search, page
    steps, expert replay and pool throughput under random actions (a random query for search[<query>])."""
    from plumbing import webshop
    from envs import EnvPool
    from plumbing.webshop import make_catalogue
    spec = {"env": "webshop", "backend": "lite", "seed": 0, "products": products, "max_steps": 15}
    print(f"\nWebShop-lite ({products} generated products; not WebShop numbers), ms:")
    t0 = time.time()
    make_catalogue(0, products)
    t_cat = time.time() - t0
    webshop.lite_site.cache_clear()
    t0 = time.time()
    env = webshop.WebShopEnv(spec)
    t_site = time.time() - t0
    words = sorted({w for g in env.goals[:200] for w in webshop.expert_query(g).split()})
    rng = np.random.default_rng(0)
    ts = []
    for _ in range(200):
        t0 = time.time()
        env.site.search(" ".join(rng.choice(words, 4)))
        ts.append(time.time() - t0)
    reset, step, replay = [], [], []
    for i in range(100):
        walk = webshop.scripted_expert(env, i)[0]
        t0 = time.time()
        ep = env.reset(i)
        reset.append(time.time() - t0)
        for a in walk:
            t0 = time.time()
            env.step(ep, a)
            step.append(time.time() - t0)
        t0 = time.time()
        env.reset(i, walk[:-1])
        replay.append(time.time() - t0)
    res = {"catalogue_s": t_cat, "site_build_s": t_site, "search_ms": np.mean(ts) * 1e3,
           "reset_ms": np.mean(reset) * 1e3, "step_ms": np.mean(step) * 1e3,
           "replay_L-1_ms": np.mean(replay) * 1e3}
    print(f"  catalogue {t_cat * 1e3:.0f}, site + BM25 index {t_site * 1e3:.0f}; search {_stats(ts)}; "
          f"reset {_stats(reset)}; step {_stats(step)}; expert prefix L-1 {_stats(replay)}")

    def rand(adm):  # an ended episode has no admissible action: its steps are refused, which is timed too
        a = adm[rng.integers(len(adm))] if adm else "click[buy now]"
        return f"search[{' '.join(rng.choice(words, 3))}]" if a == webshop.SEARCH_ACTION else a
    for w in (1, 2):
        pool = EnvPool(w, spec)
        eids = list(range(32))
        state = pool.run([("reset", e, e // 8, []) for e in eids])
        t0, n = time.time(), 0
        for _ in range(8):
            state = pool.run([("step", e, rand(s["admissible"])) for e, s in zip(eids, state)])
            n += len(eids)
        dt = time.time() - t0
        pool.close()
        res[f"pool_{w}_steps_per_s"] = n / dt
        print(f"  pool, {w} worker(s), 32 episodes x 8 random steps: {n / dt:7.1f} env-steps/s")
    return res


# ============================================================================================
# rollout: engines on the tiny model and the built-in games
# ============================================================================================
def bench_rollout(args):
    from transformers import AutoTokenizer
    from config import cache_dir, get_config
    from envs import EnvPool, room_text
    from plumbing.tasks import load_tasks
    from rollout import ExpertSource, HFEngine, Reply, group, rollout, user_message
    from plumbing.tiny import tiny_path
    cfg = get_config(["--preset", "cpu"])
    path = tiny_path(cache_dir())
    tok = AutoTokenizer.from_pretrained(path)
    tasks = load_tasks("train")
    prompts = []
    for t in tasks[:128]:  # the first decision of each game, compact prompt (~150 tokens)
        intro = "-= Welcome =-\n" + t["walkthrough"][0]
        message = user_message(t["id"].split("/")[1].split("-")[0], room_text(intro, True),
                               [], "You are in the middle of a room.", [], 0, cfg)
        prompts.append(encode_prompt(tok, message, 768)[0])
    engines = {"hf": HFEngine(path, tok)}
    try:
        from rollout import VLLMEngine
        engines["vllm"] = VLLMEngine(path, tok, seed=0, dtype="float32", max_model_len=1024,
                                     block=cfg.vllm_block)
    except Exception as e:  # noqa: BLE001
        print(f"(vLLM not available: {e})")
    res = {}
    print("bench.py rollout: tiny model (fp32, 2-core CPU), 32 new tokens per prompt, sampled, log-probs on")
    print(f"{'engine':8s} {'batch':>6s} {'tokens':>8s} {'seconds':>8s} {'tokens/s':>9s}")
    for name, eng in engines.items():
        eng.generate(prompts[:8], 8)  # warm-up
        for bs in (8, 32, 128):
            t0 = time.time()
            outs = eng.generate(prompts[:bs], 32, 1.0, seed=1)
            dt = time.time() - t0
            n = sum(len(o["ids"]) for o in outs)
            res[f"{name}_{bs}"] = n / dt
            print(f"{name:8s} {bs:6d} {n:8d} {dt:8.2f} {n / dt:9.0f}")
    if "vllm" in engines:
        print("vLLM / HF tokens/s: " + ", ".join(f"batch {bs}: {res[f'vllm_{bs}'] / res[f'hf_{bs}']:.1f}x"
                                                  for bs in (8, 32, 128)))
    sd = engines["hf"].model.state_dict()
    for name, eng in engines.items():
        ts = []
        for _ in range(5):
            t0 = time.time()
            eng.load_weights(sd.items())
            ts.append(time.time() - t0)
        res[f"sync_{name}_ms"] = 1e3 * float(np.median(ts))
        print(f"weight sync {name}: {1e3 * np.median(ts):.1f} ms "
              f"(median of 5, {sum(v.numel() for v in sd.values())} params)")
    pool = EnvPool(cfg.num_workers)
    print("\nrollout wall time, cpu preset (8 tasks x R=8, constrained, compact prompt, "
          "max 20 steps), seconds:")
    print(f"{'engine':8s} {'total':>7s} {'generation':>11s} {'environment':>12s} {'overhead':>9s} "
          f"{'env steps':>10s}")
    for name, eng in engines.items():
        groups = [group(t, ExpertSource(tasks).hint(t), t["L"] // 2, 8) for t in tasks[:8]]
        out = rollout(eng, pool, tok, groups, cfg, 0, Reply(cfg))
        st = out["stats"]
        res[f"rollout_{name}"] = {k: st[k] for k in ("t_total", "t_gen", "t_env", "t_overhead", "env_steps")}
        print(f"{name:8s} {st['t_total']:7.1f} {st['t_gen']:11.1f} {st['t_env']:12.1f} "
              f"{st['t_overhead']:9.1f} {st['env_steps']:10d}")
    pool.close()
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)


def bench_sync(args):
    """rollout.sync_check (the engine's greedy reply, scored by the trainer) after a weight sync, per engine
    dtype and trainer precision: what the sync_err column reads when the sync landed."""
    import contextlib
    import dataclasses as dc
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from config import cache_dir, get_config
    from plumbing.parallel import autocast
    from plumbing.tasks import load_tasks
    from plumbing.tiny import tiny_path
    from rollout import VLLMEngine, sync_check
    cfg = dc.replace(get_config(["--preset", "cpu"]), max_new_tokens=16)
    path = tiny_path(cache_dir())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = [{"prompt_ids": tok.encode(f"task: {t['id']}\ndone: -\n", add_special_tokens=False)}
            for t in load_tasks("train")[:16]]  # free text, as the GPU presets play
    if not args.engine_dtype:  # one engine a process (vLLM's first engine holds the process group)
        import subprocess
        print("bench.py sync: |log p engine - log p trainer| of the engine's greedy reply after a weight "
              f"sync (tiny model, CPU, {len(rows)} prompts, 16 free-text tokens each)")
        print(f"{'engine dtype':13s} {'trainer':22s} {'median':>9s} {'max':>9s}")
        for dtype in ("float32", "bfloat16"):
            subprocess.run([sys.executable, "-m", "tools.bench", "sync", "--engine_dtype", dtype]
                           + (["--json", f"{args.json}.{dtype}"] if args.json else []), cwd=ROOT, check=True)
        return
    res = {}
    for dtype in (args.engine_dtype,):
        eng = VLLMEngine(path, tok, seed=0, dtype=dtype, max_model_len=1024, constrained=False)
        eng.load_weights(model.state_dict().items())
        for name, ctx in (("fp32", contextlib.nullcontext), ("bf16 autocast (GPU's)",
                                                              lambda: autocast("cpu", torch.bfloat16))):
            err = [sync_check(eng, model, r, tok.pad_token_id, "cpu", cfg, 0, ctx) for r in rows]
            res[f"{dtype}_{name.split()[0]}"] = err
            print(f"{dtype:13s} {name:22s} {np.median(err):9.2e} {max(err):9.2e}", flush=True)
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)


# ============================================================================================
# step: one training step's time breakdown (runs train.py itself)
# ============================================================================================
def bench_step(args):
    import subprocess
    import tempfile
    out = tempfile.mkdtemp(prefix="bench-step-")
    cmd = [sys.executable, "train.py", "--preset", args.preset, "--steps", str(args.steps),
           "--eval_games", "-1", "--ckpt_every", "0", "--out_dir", out] + args.extra
    tree = os.path.abspath(args.tree) if args.tree else ROOT
    print(f"$ (cd {tree}) " + " ".join(cmd))
    r = subprocess.run(cmd, cwd=tree, capture_output=True, text=True,
                       env={**os.environ, "TQDM_DISABLE": "1"})
    if r.returncode != 0:
        sys.exit(r.stdout[-3000:] + r.stderr[-3000:])
    # skip warm-up
    recs = [json.loads(x) for x in open(os.path.join(out, "log.jsonl")) if '"eval"' not in x][1:]
    keys = [("rollout: generation", "t_gen"), ("rollout: environment", "t_env"),
            ("train (fwd/bwd/opt)", "t_train"), ("weight sync", "t_sync"), ("scheduler", "t_sched"),
            ("whole step", "t_step")]
    print(f"steps 1..{args.steps - 1} of preset {args.preset} (step 0 is warm-up), seconds per step "
          "(median, min - max over the steps; share of the median step):")
    res = {}
    for label, k in keys:
        v = np.array([x[k] for x in recs])
        res[k] = {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
                  "mean": float(v.mean())}
        print(f"  {label:24s} {np.median(v):8.3f}  ({v.min():.3f} - {v.max():.3f})  "
              f"{100 * np.median(v) / np.median([x['t_step'] for x in recs]):5.1f} %")
    print(f"  rollouts per step: {[x['rollouts'] for x in recs]} (|B|·R = {recs[0]['rollouts']})")
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)

# ============================================================================================
# gpu: a one-shot check of the GPU path (bash gpu_check.sh; --cpu runs the same on the tiny model)
# ============================================================================================
# Qwen2.5-1.5B's shape, random weights: no download
QWEN15 = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
              intermediate_size=8960, vocab_size=151936, max_position_embeddings=4096,
              tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)


def qwen15_like(out, tok_path):
    """A randomly initialised Qwen2.5-1.5B-shaped model with tiny.py's tokenizer, saved as an HF directory."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    tok = AutoTokenizer.from_pretrained(tok_path)
    cfg = Qwen2Config(bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      **QWEN15)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = Qwen2ForCausalLM(cfg)
    m.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    del m
    torch.cuda.empty_cache()
    return out


def bench_gpu(args):
    """Engine construction, engine-vs-trainer log-probs, weight reload, sleep/wake, then train.py's paper
    preset under torchrun (2 steps, resume 1, 1 step with --vllm_sleep; on a GPU also one step at one
    rank's real shape for the peak memory, and with 2+ GPUs 2-rank DDP and FSDP2 runs). Prints one table;
    --json writes it."""
    import gc
    import subprocess
    import tempfile
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from config import cache_dir
    from plumbing.tasks import load_tasks
    from plumbing.parallel import autocast
    from grpo import response_logprobs
    from plumbing.tiny import tiny_path
    cuda = not args.cpu
    if cuda and not torch.cuda.is_available():
        sys.exit("error: no CUDA device (use --cpu for the CPU form)")
    try:
        import vllm  # noqa: F401
        have_vllm = True
    except ImportError:
        have_vllm = False
    work = tempfile.mkdtemp(prefix="gpu-check-")
    path = (qwen15_like(os.path.join(work, "model"), tiny_path(cache_dir())) if cuda
            else tiny_path(cache_dir()))
    device, dt = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    rows, res = [], {"device": torch.cuda.get_device_name() if cuda else "cpu", "vllm": have_vllm}

    def row(phase, status, **kv):
        rows.append({"phase": phase, "status": status, **kv})
        print(f"[gpu_check] {phase}: {status} {kv}", flush=True)

    prompts = [encode_prompt(tok, f"task: put a {o} in the fridge\nnow: You are in a kitchen.", 512)[0]
               for o in ("apple", "egg", "mug", "tomato")]
    if have_vllm:
        from rollout import VLLMEngine
        kw = dict(seed=0, dtype="bfloat16" if cuda else "float32", max_model_len=1024, gpu_mem=0.3,
                  kv_gb=1.0 if cuda else 0.0)
        # constrained: its own process (one vllm.LLM per process), built and asked for one trie-masked reply
        code = ("import sys, json; from transformers import AutoTokenizer; "
                "from rollout import VLLMEngine, choice_ids;"
                "tok = AutoTokenizer.from_pretrained(sys.argv[1]); kw = json.loads(sys.argv[2]);"
                "e = VLLMEngine(sys.argv[1], tok, constrained=True, **kw);"
                "o = e.generate([tok.encode('hi')], 16, 1.0, 0, [choice_ids(tok, ['look', 'inventory'])])[0];"
                "print('REPLY', repr(tok.decode(o['ids'], skip_special_tokens=True)))")
        t0 = time.time()
        p = subprocess.run([sys.executable, "-c", code, path, json.dumps(kw)], capture_output=True, text=True,
                           cwd=ROOT)
        reply = [x for x in p.stdout.splitlines() if x.startswith("REPLY")]
        ok = (p.returncode == 0 and reply
              and reply[0][7:-1] in ("<action>look</action>", "<action>inventory</action>"))
        row("engine (constrained)", "ok" if ok else f"FAILED (exit {p.returncode})",
            seconds=round(time.time() - t0, 1), reply=reply[0][6:] if reply else (p.stdout + p.stderr)[-300:])
        t0 = time.time()
        eng = VLLMEngine(path, tok, sleep=cuda, constrained=False, **kw)
        row("engine (default runner)", "ok", seconds=round(time.time() - t0, 1))
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()

        # |engine log-prob - trainer log-prob| per sampled token (trainer: bf16 over fp32)
        def score(outs, T):
            rs = [{"prompt_ids": p, "response_ids": o["ids"]} for p, o in zip(prompts, outs)]
            with torch.no_grad(), autocast(device, dt):
                lp, _ = response_logprobs(policy, rs, tok.pad_token_id, device, T)
            return torch.cat([(lp[b, :len(o["ids"])].float().cpu() - torch.tensor(o["logprobs"])).abs()
                              for b, o in enumerate(outs)])
        for T in (1.0, 0.7):  # the engine's processed log-probs vs the trainer's
            d = score(eng.generate(prompts, 64, T, seed=1), T)
            row(f"log-probs T={T}", "ok", max_abs_diff=f"{d.max().item():.1e}",
                median_abs_diff=f"{d.median().item():.1e}", tokens=len(d))
        # reload_weights follows a perturbed layer: before the reload the engine disagrees with the perturbed
        # trainer, after it agrees again
        with torch.no_grad():
            down_proj = policy.model.layers[0].mlp.down_proj.weight
            down_proj.add_(0.5 * torch.randn_like(down_proj))
        before = score(eng.generate(prompts, 16, 0.0), 1.0).max().item()
        eng.load_weights(policy.state_dict().items())
        after = score(eng.generate(prompts, 16, 0.0), 1.0).max().item()
        row("reload_weights", "ok" if after < 0.1 and before > 10 * after else "MISMATCH",
            diff_before_reload=f"{before:.1e}", diff_after_reload=f"{after:.1e}")
        if cuda:  # sleep frees the engine's memory; empty_cache + wake_up restore it
            free0 = torch.cuda.mem_get_info()[0]
            eng.sleep_mode(True)
            free1 = torch.cuda.mem_get_info()[0]
            eng.sleep_mode(False)
            free2 = torch.cuda.mem_get_info()[0]
            row("sleep / wake", "ok" if free1 > free0 and free2 < free1 else "NO EFFECT",
                freed_gb=round((free1 - free0) / 2**30, 2), restored_gb=round((free1 - free2) / 2**30, 2))
        else:
            row("sleep / wake", "skipped (CPU)")
        del eng, policy
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    else:
        for name in ("engine (default runner)", "engine (constrained)", "log-probs", "reload_weights",
                     "sleep / wake"):
            row(name, "skipped (vLLM not installed)")
    # train.py itself: the paper preset under torchrun, small batch, the check's model, built-in games
    L = max(t["L"] for t in load_tasks("train"))
    common = ["--preset", "paper", "--model", path, "--games", "builtin", "--batch_tasks", "2",
              "--group_size", "2", "--max_new_tokens", "32", "--max_prompt_tokens", "1024",
              "--max_steps", str(L + 4), "--eval_games", "-1", "--train_panel", "0", "--ckpt_every", "0",
              "--num_workers", "2", "--old_logprobs", "trainer", "--engine", "vllm" if have_vllm else "hf"]
    if cuda:
        common += ["--mem_cap_gb", "80"]  # the trainer's share as on an 80 GB card
    else:
        common += ["--dtype", "bfloat16"]  # the GPU precision path, as far as the CPU allows
    runs = [("train 2 steps", ["--steps", "2"], "a", 1),
            ("resume +1 step", ["--steps", "3", "--resume", "auto"], "a", 1),
            ("1 step, --vllm_sleep 1", ["--steps", "1", "--vllm_sleep", "1"], "b", 1)]
    if cuda:
        # one rank's share of the 8-GPU job: 2 tasks x 8 rollouts, the presets' 4,096 + 512 token budgets and
        # micro-batch, so peak_gb predicts the real job (the peak is set by a micro-batch and the engine's
        # cache, not by the number of turns: 4 here, 20 in the job)
        real = ["--batch_tasks", "2", "--group_size", "8", "--max_new_tokens", "512",
                "--max_prompt_tokens", "4096", "--max_steps", "4",
                "--scheduler", "none", "--micro_batch", "8", "--steps", "1"]  # no hint: 4 policy turns
        runs.append(("1 step, one rank's real shape (peak memory)", real, "c", 1))
    if cuda and torch.cuda.device_count() >= 2:  # the cross-rank paths on real GPUs
        runs += [("2 ranks DDP, 2 steps", ["--steps", "2"], "d", 2),
                 ("2 ranks FSDP2, 2 steps", ["--steps", "2", "--parallel", "fsdp"], "e", 2)]
    else:
        rows.append({"phase": "2 ranks DDP / FSDP2", "status": "skipped (needs 2 GPUs)"})
    for name, extra, run, nproc in runs:
        out = os.path.join(work, run)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "train.py", *common, "--out_dir", out, *extra]
        t0 = time.time()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True,
                           text=True, env={**os.environ, "TQDM_DISABLE": "1"})
        if p.returncode != 0:
            row(name, f"FAILED (exit {p.returncode})", tail=(p.stdout + p.stderr)[-600:])
            continue
        rec = [json.loads(x) for x in open(os.path.join(out, "log.jsonl")) if '"eval"' not in x][-1]
        row(name, "ok", seconds=round(time.time() - t0, 1), step=rec["step"],
            peak_gb=round(rec["mem_peak_gb"], 2) if rec["mem_peak_gb"] else "-",
            sync_err=f"{rec['sync_err']:.1e}", ratio_dev=rec["ratio_dev"], clipfrac=rec["clipfrac"],
            update_rel=f"{rec['update_rel']:.2e}",
            lp_diff_max=f"{rec['lp_diff_max']:.1e}", reply_tokens=rec["tokens"],
            t_gen=round(rec["t_gen"], 1), t_train=round(rec["t_train"], 1), t_sync=round(rec["t_sync"], 2))
    res["rows"] = rows
    print(f"\ngpu_check on {res['device']} (vLLM {'installed' if have_vllm else 'not installed'}), "
          f"model {'Qwen2.5-1.5B-shaped, random' if cuda else 'tiny'}, {time.strftime('%Y-%m-%d')}")
    print("| phase | status | measurements |\n|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['status'].splitlines()[0][:80]} | "
              + ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("phase", "status", "tail")) + " |")
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)
    if any(r["status"].startswith(("FAILED", "MISMATCH", "NO EFFECT")) for r in rows):
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["sched", "env", "rollout", "sync", "step", "gpu"])
    ap.add_argument("--cpu", action="store_true", help="gpu: the same checks on the tiny model, on the CPU")
    ap.add_argument("--json", default="", help="also write the numbers here")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--only", default="",
                    help="sched: only these registered schedulers (comma-separated) beside "
                    "Agent-G² (paper); further --<config flag> <value> pairs apply to them")
    ap.add_argument("--population", default="alfworld", choices=list(POPULATIONS),
                    help="sched: the simulated tasks (bimodal: each length group splits into an easy "
                    "and a hard half)")
    ap.add_argument("--engine_dtype", default="",
                    help="sync: one engine dtype (float32 | bfloat16), in this process")
    ap.add_argument("--preset", default="cpu", help="step: the preset to time")
    ap.add_argument("--steps", type=int, default=4, help="step: training steps to run (the first is warm-up)")
    ap.add_argument("--tree", default="", help="step: run train.py of this checkout (e.g. a git worktree "
                    "of an older commit, for a before / after table); default: this one")
    a, extra = ap.parse_known_args()
    a.extra = extra  # step: further train.py flags
    if a.what == "sched":
        return bench_sched(a)
    if extra and a.what != "step":
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    return {"env": bench_env, "rollout": bench_rollout, "sync": bench_sync, "step": bench_step,
            "gpu": bench_gpu}[a.what](a)


if __name__ == "__main__":
    main()

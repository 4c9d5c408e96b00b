"""Agent-G² training: hint-guided GRPO (+ teacher-forced aux loss on the expert prefix) for ALFWorld agents.
One file, top to bottom: config, distributed setup, env pool, models + rollout engine, the loop, cleanup.

    python train.py                                        # CPU demo (preset cpu): tiny model, built-in games
    python train.py --scheduler none                       # plain GRPO on the same budget
    torchrun --standalone --nproc_per_node=8 train.py --preset paper          # Qwen2.5-1.5B, 8 GPUs
    torchrun --standalone --nproc_per_node=8 train.py --preset paper --model Qwen/Qwen2.5-7B-Instruct --parallel fsdp
    python train.py --resume auto                          # continue the latest checkpoint in out_dir
    python train.py --help                                 # every flag

One step: the scheduler picks a depth n_i for each of |B| tasks -> each rank plays R rollouts per task of its
shard, starting after n_i expert actions -> group-normalised advantages -> L = L_GRPO + eta * L_aux -> AdamW
step -> weights synced into the engine -> the scheduler is updated from the batch's success rates, gathered from
all ranks so every rank holds the same scheduler state.
"""
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time

import numpy as np

import ckpt
from config import dump, get_config

t_start = time.time()
# ------------------------------------------------------------------ config
cfg = get_config(description=__doc__)  # parse before envs: the PDDL engine overwrites sys.argv

# ------------------------------------------------------------------ distributed setup
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

ddp = int(os.environ.get("RANK", -1)) != -1
use_cuda = torch.cuda.is_available() and cfg.device != "cpu"
if ddp:
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world, local_rank = dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))
else:
    rank, world, local_rank = 0, 1, 0
master = rank == 0
device = f"cuda:{local_rank}" if use_cuda else "cpu"
dtype = {"auto": torch.bfloat16 if use_cuda else torch.float32, "float32": torch.float32,
         "bfloat16": torch.bfloat16}[cfg.dtype]
from grpo import agg_weights, lr_at, policy_loss, row_advantages  # noqa: E402
from rollout import (Prober, group_successes, make_engine, merge, response_logprobs, rollout, seed_all,  # noqa: E402
                     split_groups, sync_check)

seed_all(cfg.seed + rank)  # sampling differs per rank; data order and scheduler use cfg.seed on every rank


def _jsonable(o):  # numpy scalars in the log records
    return o.item() if hasattr(o, "item") else str(o)


def gather(obj):
    """all_gather_object over ranks (identity without DDP) -> list with one entry per rank."""
    if not ddp:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


# ------------------------------------------------------------------ tasks + env pool (before any CUDA work)
from envs import EnvPool, batch_indices, env_spec, length_table, tasks_for, train_subset  # noqa: E402

train_tasks = train_subset(tasks_for(cfg, cfg.train_split, verbose=master), cfg.train_games)
eval_tasks = tasks_for(cfg, cfg.eval_split, verbose=master)
eval_tasks = [] if cfg.eval_games < 0 else eval_tasks[:cfg.eval_games] if cfg.eval_games else eval_tasks
panel = [train_tasks[i] for i in np.random.default_rng(1234).permutation(len(train_tasks))[:cfg.train_panel]]
if master:
    print(length_table(train_tasks))
pool = EnvPool(cfg.num_workers, env_spec(cfg))

# ------------------------------------------------------------------ models, reference, rollout engine, optimizer
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from scheduler import Scheduler  # noqa: E402
from tiny import resolve_model  # noqa: E402

model_path = resolve_model(cfg) if master else None
model_path = gather(model_path)[0]  # rank 0 builds the tiny model once
tok = AutoTokenizer.from_pretrained(model_path)
policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
if cfg.grad_ckpt:
    policy.gradient_checkpointing_enable()
ref = None
if cfg.kl_coef > 0 and cfg.mode in ("grpo", "aux_only"):
    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval().requires_grad_(False)
model = policy
if ddp and cfg.parallel == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(policy, device_ids=[local_rank] if use_cuda else None)
elif ddp:  # FSDP2: shard every decoder layer, then the root; full weights are gathered for the engine sync
    from torch.distributed.fsdp import fully_shard
    for layer in policy.model.layers:
        fully_shard(layer)
    model = fully_shard(policy)
engine = make_engine(cfg, model_path, tok, device, cfg.seed + rank)
opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2))
sched = Scheduler(cfg, [t["id"] for t in train_tasks], [t["L"] for t in train_tasks], seed=cfg.seed)


fsdp = ddp and cfg.parallel == "fsdp"
if fsdp:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)
    FULL = StateDictOptions(full_state_dict=True)  # gathered on every rank: each rank's engine needs all weights


def full_state():
    """Full (unsharded) weights for the engine sync and checkpoints."""
    return get_model_state_dict(policy, options=FULL) if fsdp else policy.state_dict()


DUMMY = {"prompt_ids": [tok.eos_token_id], "response_ids": [tok.eos_token_id]}
# released code (--prefix_unit token): the ratio applies to the token length of the rendered "Step i: action" lines
tok_cum = {t["id"]: np.cumsum([len(tok.encode(f"Step {i + 1}: {a}\n", add_special_tokens=False))
                               for i, a in enumerate(t["walkthrough"])]).tolist()
           for t in train_tasks} if cfg.prefix_unit == "token" else {}


def token_logprobs(m, rows):  # the distribution the engine sampled: trie-restricted, at the rollout temperature
    return response_logprobs(m, rows, tok.pad_token_id, device, cfg.temperature)


def loss_terms(rows, aux, counts):
    """Backward of this rank's share of L = L_GRPO + eta L_aux, one micro-batch at a time. The math is grpo.py's;
    weights use global counts (tokens, rows, episodes, aux tokens over all ranks), so DDP's gradient average equals
    the single-process loss on the global batch. Returns this rank's sums of the logged terms."""
    parts = {"pg": 0.0, "kl": 0.0, "aux": 0.0, "clipped": 0.0, "ratio_dev": 0.0, "finite": 1.0}
    ep_tok = {}
    for r in rows:
        ep_tok[r["eid"]] = ep_tok.get(r["eid"], 0) + len(r["response_ids"])
    if ref is None:  # zero advantage and no KL term: these rows carry no gradient, skip their forward pass
        rows = [r for r in rows if r["adv"] != 0.0]
    use_pg = cfg.mode == "grpo" and rows
    use_aux = cfg.mode != "grpo" or cfg.eta > 0
    rows = sorted(rows, key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))  # less padding per micro-batch
    aux = sorted(aux, key=lambda r: len(r["prompt_ids"]) + len(r["response_ids"]))
    work = ([("pg", rows[i:i + cfg.micro_batch]) for i in range(0, len(rows), cfg.micro_batch)] if use_pg else []) + \
        ([("aux", aux[i:i + cfg.micro_batch]) for i in range(0, len(aux), cfg.micro_batch)] if use_aux else [])
    # every rank runs the same number of forward/backward passes (FSDP all-gathers in each; DDP reduces in the
    # last): pad with zero-loss passes on a one-token dummy row
    n_work = torch.tensor([max(len(work), 1)])
    if ddp:
        dist.all_reduce(n_work, op=dist.ReduceOp.MAX)
    work += [("none", [DUMMY])] * (int(n_work.item()) - len(work))
    for j, (kind, mb) in enumerate(work):
        ctx = model.no_sync() if (ddp and not fsdp and j < len(work) - 1) else contextlib.nullcontext()
        with ctx:
            if kind == "none":
                loss = token_logprobs(model, mb)[0].sum() * 0.0
            elif kind == "aux":  # teacher forcing on the expert prefix: -sum log pi(a*_t | s_t), token mean
                lp, m = token_logprobs(model, mb)
                w = cfg.eta if cfg.mode == "grpo" else 1.0  # aux_only / SFT: the NLL alone
                loss = -(lp * m).sum() / max(counts["aux_tokens"], 1) * w * world
                parts["aux"] += loss.item() / w / world  # = local sum / global count
            else:
                lp, m = token_logprobs(model, mb)  # [b, T]
                old = torch.zeros_like(lp)  # the engine's log-probs of the same tokens: ratio 1 on-policy
                for b, r in enumerate(mb):
                    old[b, :len(r["logprobs"])] = torch.tensor(r["logprobs"], device=device)
                rlp = None
                if ref is not None:
                    with torch.no_grad():
                        rlp = token_logprobs(ref, mb)[0]
                w = agg_weights(cfg.loss_agg, torch.tensor([len(r["response_ids"]) for r in mb]),
                                torch.tensor([ep_tok[r["eid"]] for r in mb]), counts["tokens"], counts["rows"],
                                counts["episodes"]).to(device)  # [b]
                adv = torch.tensor([r["adv"] for r in mb], device=device)  # [b]
                loss, st = policy_loss(lp, old, adv, m, w, cfg.clip_eps, rlp, cfg.kl_coef)
                loss = loss * world
                for k in ("pg", "kl", "clipped"):
                    parts[k] += st[k]
                parts["ratio_dev"] = max(parts["ratio_dev"], st["ratio_dev"])
            if not torch.isfinite(loss):  # still join the all-reduce (a zero loss), then skip the update
                parts["finite"] = 0.0
                loss = token_logprobs(model, [DUMMY])[0].sum() * 0.0
            loss.backward()
    return parts


def update_size(step_fn):
    """Run the optimizer step; return ||theta_new - theta_old|| / ||theta_old|| over all parameters (this rank's
    shards under FSDP, summed over ranks)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731  (FSDP2 DTensor shard)
    before = [local(p.detach()).clone() for p in params]
    step_fn()
    sq = torch.tensor([sum(((local(p.detach()) - b).double() ** 2).sum().item() for p, b in zip(params, before)),
                       sum((b.double() ** 2).sum().item() for b in before)], dtype=torch.float64)
    if fsdp:
        dist.all_reduce(sq)
    return math.sqrt(sq[0].item() / max(sq[1].item(), 1e-30))


def save_checkpoint(step, reason):
    """Every rank joins the gathers; rank 0 writes (ckpt.py: atomic, keeps the newest keep_ckpts)."""
    weights = full_state()
    opt_state = get_optimizer_state_dict(policy, opt, options=FULL) if fsdp else opt.state_dict()
    rng = gather(ckpt.rng_state())
    if master:
        path = ckpt.save(cfg.out_dir, step, policy, tok, weights, {"opt": opt_state, "rng": rng},
                         {"step": step, "reason": reason, "sched": sched.state_dict(), "redraws": redraws,
                          "wall_s": time.time() - t_start},
                         cfg, cfg.keep_ckpts)
        print(f"[ckpt] step {step} -> {path} ({reason})")


# ------------------------------------------------------------------ resume
start_step, redraws, log_mode = 0, 0, "w"
if cfg.resume:
    path, sd, tr, st = ckpt.load(cfg.resume, cfg.out_dir, policy.config.tie_word_embeddings)
    if fsdp:
        set_model_state_dict(policy, sd, options=FULL)
        set_optimizer_state_dict(policy, opt, tr["opt"], options=FULL)
    else:
        policy.load_state_dict(sd)
        opt.load_state_dict(tr["opt"])
    ckpt.set_rng_state(tr["rng"][rank] if rank < len(tr["rng"]) else tr["rng"][0])
    sched.load_state_dict(st["sched"])
    start_step, redraws, log_mode = st["step"], st["redraws"], "a"
    t_start -= st.get("wall_s", 0.0)  # summary.json's wall_s: every sitting up to its last checkpoint, summed
    engine.load_weights(full_state().items())
    if master:
        print(f"[resume] {path}: continuing at step {start_step}")

if master:
    os.makedirs(cfg.out_dir, exist_ok=True)
    dump(cfg, os.path.join(cfg.out_dir, "config.json"))
    if cfg.resume:
        ckpt.trim_log(os.path.join(cfg.out_dir, "log.jsonl"), start_step, final=start_step >= cfg.steps)
    log = open(os.path.join(cfg.out_dir, "log.jsonl"), log_mode)
    wb = None
    if cfg.wandb:
        import wandb
        wb = wandb.init(project="agent-g2", config=json.load(open(os.path.join(cfg.out_dir, "config.json"))))

stop = {"flag": False}


def _on_signal(signum, frame):  # finish the current step, checkpoint, exit; a second signal aborts
    if stop["flag"]:
        raise KeyboardInterrupt
    stop["flag"] = True
    if master:
        print(f"\n[signal {signum}] stopping after this step; a checkpoint will be written")


signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def run_eval(step):
    """Hint-free evaluation (eval.in_loop_eval: validation + training panel, greedy and sampled, transcripts)."""
    from eval import in_loop_eval
    res = in_loop_eval(engine, pool, tok, {"val": eval_tasks, "train_panel": panel}, cfg, step, rank, world, gather)
    if master:
        print(f"[eval] step {step}: " + "  ".join(f"{k} {100 * v:.1f}%" for k, v in res.items()))
        log.write(json.dumps({"step": step, "eval": res}) + "\n")
        log.flush()
    return res


# ------------------------------------------------------------------ the loop
from tqdm import tqdm  # noqa: E402

if start_step == 0:
    run_eval(0)
bad = 0
bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, disable=not master, desc="train",
           dynamic_ncols=True)
for step in bar:
    t0 = time.time()
    lr = lr_at(step, cfg.lr, cfg.steps, cfg.warmup_frac, cfg.lr_schedule)
    for g in opt.param_groups:
        g["lr"] = lr
    # 1. depths for the global batch (identical on every rank), then this rank's shard
    idx = batch_indices(step, cfg.batch_tasks, len(train_tasks), cfg.seed)  # same order on resume
    tasks = [train_tasks[i] for i in idx]
    mine = list(range(rank, len(tasks), world))
    prober = Prober(engine, pool, tok, [tasks[i] for i in mine], cfg, cfg.seed + 97 * step + rank)

    def probe(pairs):  # each rank runs the probes of its own tasks; counts are shared so every rank agrees
        local = [(mine.index(i), n) for i, n in pairs if i in mine]
        got = dict(zip([(mine[j], n) for j, n in local], prober(local)))
        for part in gather(got):
            got.update(part)
        return [got[p] for p in pairs]
    t_sched = time.time()
    sched_tasks = [{"id": t["id"], "L": t["L"], **({"tok_cum": tok_cum[t["id"]]} if tok_cum else {})} for t in tasks]
    plan = sched.depths(sched_tasks, step, probe)
    for _ in range(10):  # no task leaves the policy a step: re-draw (a deterministic schedule cannot, so bounded)
        if cfg.mode != "grpo" or any(n < cfg.max_steps for n in plan["n"]):
            break
        redraws += 1
        plan = sched.depths(sched_tasks, step, probe)
    t_sched = time.time() - t_sched - prober.stats.get("t_total", 0.0)
    # 2. rollouts of this rank's shard (probe groups already played are reused, not replayed)
    t1 = time.time()
    if cfg.mode in ("sft_full", "sft_prefix"):  # SFT baselines: expert rows only, no policy play
        ns = [tasks[i]["L"] if cfg.mode == "sft_full" else plan["n"][i] for i in mine]
        out = rollout(engine, pool, tok, [{"task": tasks[i], "n": n, "R": 1} for i, n in zip(mine, ns)],
                      dataclasses.replace(cfg, max_steps=0), cfg.seed + step)
        out["episodes"] = []
    else:  # groups already played as the chosen probe are reused; the rest are played now, in one batch
        groups = [prober.take(j, plan["n"][i]) for j, i in enumerate(mine)]
        todo = [j for j, g in enumerate(groups) if g is None]
        fresh = rollout(engine, pool, tok, [{"task": tasks[mine[j]], "n": plan["n"][mine[j]], "R": cfg.group_size}
                                            for j in todo], cfg, cfg.seed * 1_000_003 + step * 1009 + rank)
        for j, g in zip(todo, split_groups(fresh, len(todo))):
            groups[j] = g
        out = merge(groups)
        out["stats"] = fresh["stats"]
    t_roll = time.time() - t1
    # 3. success rates of the whole batch, from every rank -> identical scheduler update everywhere
    flags_local = group_successes(out, len(mine)) if out["episodes"] else [[] for _ in mine]
    flags = [None] * len(tasks)
    for r_mine, r_flags in gather((mine, flags_local)):
        for i, f in zip(r_mine, r_flags):
            flags[i] = f
    if cfg.mode not in ("sft_full", "sft_prefix"):
        p_hat = [sum(f) / len(f) if f else 0.0 for f in flags]
        sched.update([t["id"] for t in tasks], p_hat, flags)
    else:
        p_hat = [float("nan")] * len(tasks)
    # 4. GRPO advantages within each group, then the loss and the update (error episodes train on nothing)
    t2 = time.time()
    err = {e["eid"] for e in out["episodes"] if e["error"]}
    rows = [r for r in out["rows"] if r["eid"] not in err]
    n_zero, n_groups = row_advantages(rows, out["episodes"], cfg.adv_level) if out["episodes"] else (0, 0)
    counts = torch.tensor([sum(len(r["response_ids"]) for r in rows), len(rows), len({r["eid"] for r in rows}),
                           sum(len(r["response_ids"]) for r in out["aux"])], dtype=torch.float64)
    if ddp:
        dist.all_reduce(counts)
    counts = dict(zip(("tokens", "rows", "episodes", "aux_tokens"), counts.tolist()))
    model.train()
    engine.sleep_mode(True)  # --vllm_sleep (GPU): free the engine's memory during the update
    opt.zero_grad(set_to_none=True)
    parts = loss_terms(rows, out["aux"], counts)
    finite = torch.tensor([parts.pop("finite")], dtype=torch.float64)
    ratio_dev = torch.tensor([parts.pop("ratio_dev")], dtype=torch.float64)
    if ddp:
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        dist.all_reduce(ratio_dev, op=dist.ReduceOp.MAX)
        vec = torch.tensor(list(parts.values()), dtype=torch.float64)  # each rank: its sum / the global count
        dist.all_reduce(vec)
        parts = dict(zip(parts, vec.tolist()))
    parts["clipfrac"] = parts.pop("clipped") / max(counts["tokens"], 1)
    parts["ratio_dev"] = ratio_dev.item()  # max |pi / pi_engine - 1| over tokens: 0 when on-policy
    upd = 0.0
    if finite.item() < 1:
        bad += 1
        opt.zero_grad(set_to_none=True)
        if master:
            print(f"[warn] step {step}: non-finite loss, update skipped ({bad} in a row)")
        if bad >= cfg.max_bad_steps:
            save_checkpoint(step, "non-finite loss")
            sys.exit(f"error: {bad} non-finite losses in a row at step {step}; stopped (checkpoint written)")
        gnorm = float("nan")
    else:
        bad = 0
        gnorm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip).item()
        if gnorm > 0:  # no signal, no step: Adam would turn a zero gradient into a full-size move via momentum
            upd = update_size(opt.step)
    model.eval()
    t_train = time.time() - t2
    # 5. weight sync into the rollout engine
    t3 = time.time()
    engine.sleep_mode(False)
    state = full_state()
    engine.load_weights(state.items())
    t_sync = time.time() - t3
    sync_err = sync_check(engine, model, (rows or out["aux"] or [DUMMY])[0], tok.pad_token_id, device, cfg, step)
    # cross-rank consistency: every rank must hold the same weights and scheduler state
    psum = sum(p.detach().double().sum().item() for p in state.values())
    consist = gather((psum, json.dumps(sched.state_dict(), sort_keys=True)))
    # 6. log (rank 0): one dense line + JSONL
    st = gather(out["stats"])
    pst = gather(prober.stats)
    n_eps = sum(gather(len(out["episodes"])))
    zero = gather((n_zero, n_groups))
    n_err = sum(gather(len(err)))
    if master:
        ph = [p for p in p_hat if p == p]
        s = sched.stats()
        rec = {"step": step, "lr": lr, "success": float(np.mean(ph)) if ph else None,
               "in_band": float(np.mean([0.4 <= p <= 0.6 for p in ph])) if ph else None,
               "all0": float(np.mean([p == 0 for p in ph])) if ph else None,
               "all1": float(np.mean([p == 1 for p in ph])) if ph else None,
               "zero_adv_groups": sum(z for z, _ in zero), "groups": sum(g for _, g in zero),
               **parts, "grad_norm": gnorm, "update_rel": upd, "stepped": upd > 0,
               "error_episodes": n_err,
               "mean_n": float(np.mean(plan["n"])), "mean_r": float(np.mean(plan["r"])),
               "mu_global": s["mu_global"], "A": s["A"], "V": s["V"], "mu_k": s["mu_k"], "sigma_k": s["sigma_k"],
               "rollouts": n_eps, "probe_rollouts": plan["probe_rollouts"],  # trained on (|B| R) / extra
               "rollouts_played": sum(x.get("rollouts", 0) for x in st) + sum(x.get("rollouts", 0) for x in pst),
               "tokens": sum(x.get("gen_tokens", 0) for x in st) + sum(x.get("gen_tokens", 0) for x in pst),
               "invalid": sum(x.get("invalid", 0) for x in st), "truncated": sum(x.get("truncated", 0) for x in st),
               "env_errors": sum(x.get("errors", 0) for x in st), "redraws": redraws,
               "sync_err": sync_err, "rank_param_spread": max(c[0] for c in consist) - min(c[0] for c in consist),
               "sched_same_on_ranks": len({c[1] for c in consist}) == 1,
               "t_rollout": t_roll, "t_gen": st[0].get("t_gen", 0.0), "t_env": st[0].get("t_env", 0.0),
               "t_train": t_train, "t_sync": t_sync, "t_sched": t_sched, "t_step": time.time() - t0}
        log.write(json.dumps(rec, default=_jsonable) + "\n")
        log.flush()
        if wb:
            wb.log(rec, step=step)
        cl = " ".join(f"k{k}:{m:.2f}/{sg:.2f}/{a:.2f}/{v:.3f}" for k, (m, sg, a, v)
                      in enumerate(zip(s["mu_k"], s["sigma_k"], s["A"], s["V"])))
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        bar.write(f"step {step:4d} | succ {fmt(rec['success'])} band {fmt(rec['in_band'])} 0s {fmt(rec['all0'])} "
                  f"1s {fmt(rec['all1'])} | pg {rec.get('pg', 0):+.4f} aux {rec.get('aux', 0):.3f} "
                  f"kl {rec.get('kl', 0):.4f} clip {rec['clipfrac']:.3f} upd {upd:.1e} | mu_g {s['mu_global']:.2f} {cl} | n {rec['mean_n']:.1f} | "
                  f"roll {rec['rollouts']}+{rec['probe_rollouts']} tok {rec['tokens']} | "
                  f"t roll {t_roll:.1f} train {t_train:.1f} sync {t_sync:.2f}s")
    # 7. evaluation and checkpoints
    if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
        run_eval(step + 1)
    if stop["flag"] or (cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0) or step + 1 == cfg.steps:
        save_checkpoint(step + 1, "signal" if stop["flag"] else "periodic")
    if stop["flag"]:
        break

# ------------------------------------------------------------------ cleanup
if not stop["flag"]:
    run_eval(cfg.steps)
    if master:  # the run's small record: what run_all.sh keeps and `eval.py table` reads
        from eval import run_summary
        summary = {k: v for k, v in run_summary(cfg.out_dir, wall_s=time.time() - t_start).items() if k != "run"}
        json.dump(summary, open(os.path.join(cfg.out_dir, "summary.json"), "w"), indent=1, default=_jsonable)
pool.close()
if master:
    log.close()
# vLLM's own atexit shutdown tears down the process group; destroying it here first would make that fail.
if ddp and not hasattr(engine, "llm"):
    dist.destroy_process_group()
sys.exit(0 if not stop["flag"] else 130)

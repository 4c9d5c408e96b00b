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
from config import check_data, check_model, check_out_dir, model_error  # noqa: E402

check_model(cfg.model)  # one-line errors (exit 2) before any heavy work
check_data(cfg)
check_out_dir(cfg, clear=os.environ.get("RANK", "0") == "0")

# ------------------------------------------------------------------ distributed setup
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from parallel import all_max, all_sum, autocast, compute_dtype, fsdp2_shard, init_distributed, local_first  # noqa: E402

use_cuda = torch.cuda.is_available() and cfg.device != "cpu"
ddp, rank, world, local_rank, device = init_distributed(use_cuda)  # LOCAL_RANK -> device, RANK -> data shard
master = rank == 0  # global rank 0 alone writes logs and checkpoints
if use_cuda and cfg.mem_cap_gb > 0:  # e.g. 80 on a 141 GB card: what an 80 GB card would leave the trainer
    torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.mem_cap_gb * 2**30 / torch.cuda.mem_get_info()[1]))
dtype = compute_dtype(cfg.dtype, use_cuda)  # forward passes; the policy's master weights and AdamW stay fp32
old_from_trainer = cfg.old_logprobs == "trainer" or (cfg.old_logprobs == "auto" and use_cuda)
from grpo import adamw_update_norm, lr_at, mini_batches, row_advantages  # noqa: E402
from learner import Learner  # noqa: E402
from rollout import Prober, group_successes, make_engine, merge, rollout, seed_all, split_groups, sync_check  # noqa: E402

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
from envs import EnvPool, batch_indices, env_spec, tasks_for, train_subset  # noqa: E402
from eval import end_lines, eval_sets, eval_splits, in_loop_eval, run_summary  # noqa: E402
from gamegen import length_table  # noqa: E402

train_tasks = train_subset(local_first(lambda: tasks_for(cfg, cfg.train_split, verbose=master), ddp, local_rank),
                           cfg.train_games)  # each node extracts its own cache, once
cut = lambda ts: [] if cfg.eval_games < 0 else ts[:cfg.eval_games] if cfg.eval_games else ts  # noqa: E731
val_sets = [(name, cut(tasks_for(cfg, split, verbose=master))) for name, split in eval_splits(cfg)]  # [(name, tasks)]
panel = [train_tasks[i] for i in np.random.default_rng(1234).permutation(len(train_tasks))[:cfg.train_panel]]
if master:
    print(length_table(train_tasks))
pool = EnvPool(cfg.num_workers, env_spec(cfg))

# ------------------------------------------------------------------ models, reference, rollout engine, optimizer
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from scheduler import Scheduler, token_offsets  # noqa: E402
from tiny import resolve_model  # noqa: E402

model_path = local_first(lambda: resolve_model(cfg), ddp, local_rank)  # 'tiny': built once per node (same seed)
try:
    tok = AutoTokenizer.from_pretrained(model_path)
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)  # fp32 master weights
except (OSError, ValueError) as e:  # a hub id that is not reachable (offline, a typo)
    model_error(cfg.model, e)
if cfg.grad_ckpt:
    policy.gradient_checkpointing_enable()
model, fsdp, ref = policy, ddp and cfg.parallel == "fsdp", None
if cfg.kl_coef > 0 and cfg.mode in ("grpo", "aux_only"):  # the reference computes as the policy does (KL 0 at step
    # 0): FSDP2 casts both to bf16; DDP / one process: fp32 weights under the same autocast (bf16 weights would
    # keep a bf16 residual stream beside the policy's fp32 one)
    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype if fsdp else torch.float32).to(device)
    ref.eval().requires_grad_(False)
if ddp and not fsdp:  # gradients reduced in place (no second copy); no buffers to broadcast each forward
    model = torch.nn.parallel.DistributedDataParallel(policy, device_ids=[local_rank] if use_cuda else None,
                                                      gradient_as_bucket_view=True, broadcast_buffers=False)
elif fsdp:  # FSDP2: every decoder layer, then the root; the reference too (7B: 15 GB in bf16)
    fsdp2_shard(policy, ref, dtype)
n_eval = max([len(ts) for _, ts in val_sets] + [len(panel), cfg.authors_episodes if cfg.eval_protocol != "panel" else 0])
seqs = max(-(-cfg.batch_tasks // world) * cfg.group_size, -(-n_eval // world))
engine = make_engine(cfg, model_path, tok, device, cfg.seed + rank, seqs)  # seqs: what a rank plays at once
opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2))
sched = Scheduler(cfg, [t["id"] for t in train_tasks], [t["L"] for t in train_tasks], seed=cfg.seed)


if fsdp:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)
    FULL = StateDictOptions(full_state_dict=True)
    FULL_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)  # checkpoints: gathered into rank 0's RAM
prec = (lambda: contextlib.nullcontext()) if fsdp else (lambda: autocast(device, dtype))  # FSDP casts itself
learn = Learner(cfg, model, ref, tok, device, world, ddp, fsdp, prec, old_from_trainer)  # the loss passes
psum = [0.0]


def engine_weights():
    """(name, full tensor) pairs for the engine sync, one at a time: under FSDP each parameter is gathered as it
    is consumed, so no rank ever holds a second full copy of the model. Also sums them (cross-rank check)."""
    psum[0] = 0.0
    for k, v in policy.state_dict().items():
        v = v.full_tensor() if hasattr(v, "full_tensor") else v  # FSDP2 DTensor -> all-gathered
        psum[0] += v.detach().double().sum().item()
        yield k, v


# released code (--prefix_unit token): the ratio applies to the token length of the rendered "Step i: action" text
tok_cum = {t["id"]: token_offsets(tok, t["walkthrough"]) for t in train_tasks} if cfg.prefix_unit == "token" else {}


def update_size():
    """Run the optimizer step; return ||theta_new - theta_old|| / ||theta_old|| over all parameters, from AdamW's
    state (grpo.adamw_update_norm: no copy of the weights); FSDP: this rank's shards, summed over ranks."""
    opt.step()
    sq = torch.tensor(adamw_update_norm(opt), dtype=torch.float64)
    if fsdp:
        dist.all_reduce(sq)
    return math.sqrt(sq[0].item() / max(sq[1].item(), 1e-30))


def update(rows, aux):
    """The batch's optimizer steps: ceil(global rows / --ppo_mini_batch) mini-batches (0: one), each task's step
    rows and aux rows spread over them in order, each mini-batch's loss normalised by its own global counts
    (verl's dp_actor: several optimizer steps per batch). pi_old is fixed for all of them
    before the first step. -> (logged parts, summed relative update size, mean grad norm; nan if any non-finite)."""
    n_rows = all_sum(len(rows), ddp)  # the global batch: the same mini-batches on 1 GPU or 8 (grpo.mini_batches)
    n_mb = max(1, -(-n_rows // cfg.ppo_mini_batch)) if cfg.ppo_mini_batch else 1
    mbs = list(zip(mini_batches(rows, n_mb), mini_batches(aux, n_mb)))
    # rows with zero advantage and no KL term carry no gradient: no forward pass (they still count in the means)
    keep = (lambda mb: mb) if ref is not None else (lambda mb: [r for r in mb if r["adv"] != 0.0])
    mis, mis_max = [0.0, 0.0, 0.0], 0.0  # engine vs trainer on the sampled tokens: sum |d|, sum k3, tokens; max |d|
    for mb, _ in mbs if old_from_trainer and cfg.mode == "grpo" else []:
        s, mx, k3, n = learn.old_logprobs(keep(mb))
        mis, mis_max = [mis[0] + s, mis[1] + k3, mis[2] + n], max(mis_max, mx)
    tot = {"pg": 0.0, "kl": 0.0, "entropy": 0.0, "aux": 0.0, "clipped": 0.0}
    upd, gnorms, dev = 0.0, [], 0.0
    for mb, amb in mbs:
        ep_tok = {}  # response tokens per episode within the mini-batch (the "episode" aggregation)
        for r in mb:
            ep_tok[r["eid"]] = ep_tok.get(r["eid"], 0) + len(r["response_ids"])
        c = torch.tensor([sum(ep_tok.values()), len(mb), len(ep_tok), sum(len(r["response_ids"]) for r in amb),
                          sum(1.0 / r["n"] for r in amb)], dtype=torch.float64)
        if ddp:
            dist.all_reduce(c)
        counts = dict(zip(("tokens", "rows", "episodes", "aux_tokens", "aux_weight"), c.tolist()))
        opt.zero_grad(set_to_none=fsdp or not ddp)  # DDP: keep the gradients as views of its reduction buckets
        parts = learn.loss_terms(keep(mb), amb, counts, ep_tok)
        finite = all_max(int(parts.pop("finite") < 1), ddp) == 0
        dev = max(dev, parts.pop("ratio_dev"))
        for k in tot:
            tot[k] += parts[k]
        # the gradient norm is the same on every rank (DDP: reduced grads; FSDP: a global norm), so is this decision
        gnorm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip).item() if finite else math.nan
        gnorms.append(gnorm)
        if not math.isfinite(gnorm):
            opt.zero_grad(set_to_none=True)
        elif gnorm > 0:  # no signal, no step: Adam would turn a zero gradient into a full-size move via momentum
            upd += update_size()
    S = torch.tensor(list(tot.values()) + [sum(len(r["response_ids"]) for r in rows)] + mis, dtype=torch.float64)
    M = torch.tensor([dev, mis_max], dtype=torch.float64)
    if ddp:  # sums and maxima over ranks
        dist.all_reduce(S)
        dist.all_reduce(M, op=dist.ReduceOp.MAX)
    S = S.tolist()
    out = {k: v / n_mb for k, v in zip(("pg", "kl", "entropy", "aux"), S)}  # each mini-batch's mean, averaged
    out["clipfrac"] = S[4] / max(S[5], 1)
    out["ratio_dev"] = M[0].item()  # max |pi / pi_old - 1|: 0 with one update per batch, > 0 from the second on
    if old_from_trainer:  # how far the engine that sampled is from the trainer that scores (bf16 kernels differ)
        out.update(lp_diff_mean=S[6] / max(S[8], 1), lp_diff_max=M[1].item(), lp_kl=S[7] / max(S[8], 1))
    return out, upd, float(np.mean(gnorms)) if all(map(math.isfinite, gnorms)) else math.nan


def save_checkpoint(step, reason):
    """Every rank joins the gathers; rank 0 writes (ckpt.py: atomic, keeps the newest keep_ckpts)."""
    weights = get_model_state_dict(policy, options=FULL_CPU) if fsdp else policy.state_dict()
    opt_state = get_optimizer_state_dict(policy, opt, options=FULL_CPU) if fsdp else opt.state_dict()
    rng = gather(ckpt.rng_state())
    if master:
        path = ckpt.save(cfg.out_dir, step, policy, tok, weights, {"opt": opt_state, "rng": rng},
                         {"step": step, "reason": reason, "sched": sched.state_dict(), "redraws": redraws,
                          "wall_s": time.time() - t_start},
                         cfg, cfg.keep_ckpts)
        print(f"[ckpt] step {step} -> {path} ({reason})")
    if ddp:  # nobody exits (torchrun then stops the others) before rank 0 has finished writing
        dist.barrier()


# ------------------------------------------------------------------ resume
start_step, redraws, log_mode = 0, 0, "w"
if cfg.resume:
    path, sd, tr, st = ckpt.load(cfg.resume, cfg.out_dir, policy.config.tie_word_embeddings, not fsdp or master)
    if fsdp:  # rank 0 reads the files and broadcasts: 8 host copies of a 7B model and its AdamW state would not fit
        FROM0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(policy, sd, options=FROM0)
        set_optimizer_state_dict(policy, opt, tr["opt"], options=FROM0)
    else:
        policy.load_state_dict(sd)
        opt.load_state_dict(tr["opt"])
    ckpt.set_rng_state(tr["rng"][rank] if rank < len(tr["rng"]) else tr["rng"][0])
    sched.load_state_dict(st["sched"])
    start_step, redraws, log_mode = st["step"], st["redraws"], "a"
    t_start -= st.get("wall_s", 0.0)  # summary.json's wall_s: every process of the run up to its last checkpoint, summed
    engine.load_weights(engine_weights())
    if master:
        print(f"[resume] {path}: continuing at step {start_step}")
        for change in ckpt.changed_flags(path, cfg):  # a silent change would splice two experiments into one run
            print(f"[resume] warning: the checkpoint was trained with other flags, {change}")

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
    print(f"\n[rank {rank}: signal {signum}] every rank stops after this step; a checkpoint will be written")


signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def run_eval(step):
    """The hint-free evaluations due at this step (eval.eval_sets: the panel of every validation split and the
    training panel, greedy and sampled; the authors' draw, sampled), with transcripts; none due: nothing."""
    sets = eval_sets(cfg, step, val_sets, panel)
    if not sets:
        return
    res = in_loop_eval(engine, pool, tok, sets, cfg, step, rank, world, gather)
    if master:
        print(f"[eval] step {step}: " + "  ".join(f"{k} {100 * v:.1f}%" for k, v in res.items() if k != "counts"))
        log.write(json.dumps({"step": step, "eval": res}) + "\n")
        log.flush()
    return res


# ------------------------------------------------------------------ the loop
from tqdm import tqdm  # noqa: E402

if start_step == 0:
    run_eval(0)
bad, stopped = 0, False
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
    t_probe = prober.stats.get("t_total", 0.0)  # probe schedulers play their groups here, not in step 2
    t_sched = time.time() - t_sched - t_probe
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
        p_hat = [sum(f) / len(f) if f else None for f in flags]  # None: every episode errored
        sched.update([t["id"] for t in tasks], p_hat, flags)
    else:
        p_hat = [float("nan")] * len(tasks)
    # 4. GRPO advantages within each group, then the loss and the update (error episodes train on nothing)
    t2 = time.time()
    err = {e["eid"] for e in out["episodes"] if e["error"]}
    rows = [r for r in out["rows"] if r["eid"] not in err]
    n_zero, n_groups = row_advantages(rows, out["episodes"], cfg.adv_level) if out["episodes"] else (0, 0)
    model.train()
    engine.sleep_mode(True)  # --vllm_sleep (GPU): free the engine's memory during the update
    parts, upd, gnorm = update(rows, out["aux"])
    if not math.isfinite(gnorm):  # a non-finite loss or gradient: its update was skipped; stop after max_bad_steps
        bad += 1
        if master:
            print(f"[warn] step {step}: non-finite loss or gradient, update skipped ({bad} in a row)")
        if bad >= cfg.max_bad_steps:
            save_checkpoint(step, "non-finite loss")
            sys.exit(f"error: {bad} non-finite losses in a row at step {step}; stopped (checkpoint written)")
    else:
        bad = 0
    model.eval()
    t_train = time.time() - t2
    # 5. weight sync into the rollout engine
    t3 = time.time()
    engine.sleep_mode(False)
    engine.load_weights(engine_weights())
    t_sync = time.time() - t3
    sync_err = sync_check(engine, model, (rows or out["aux"] or [learn.DUMMY])[0], tok.pad_token_id, device, cfg, step,
                          prec)
    # cross-rank consistency: every rank must hold the same weights and scheduler state
    consist = gather((psum[0], json.dumps(sched.state_dict(), sort_keys=True)))
    # 6. log (rank 0): one dense line + JSONL
    st = gather(out["stats"])
    pst = gather(prober.stats)
    n_eps = sum(gather(len(out["episodes"])))
    zero = gather((n_zero, n_groups))
    n_err = sum(gather(len(err)))
    if master:
        ph = [p for p in p_hat if p is not None and p == p]
        s = sched.stats()
        rec = {"step": step, "lr": lr, "success": float(np.mean(ph)) if ph else None,
               "in_band": float(np.mean([0.4 <= p <= 0.6 for p in ph])) if ph else None,
               "all0": float(np.mean([p == 0 for p in ph])) if ph else None,
               "all1": float(np.mean([p == 1 for p in ph])) if ph else None,
               "zero_adv_groups": sum(z for z, _ in zero), "groups": sum(g for _, g in zero),
               **parts, "grad_norm": gnorm, "update_rel": upd, "stepped": upd > 0,
               "error_episodes": n_err,
               "mean_n": float(np.mean(plan["n"])), "mean_r": float(np.mean(plan["r"])),
               **s,  # the scheduler's stats() whole: a new statistic is logged without a line here
               "rollouts": n_eps, "probe_rollouts": plan["probe_rollouts"],  # trained on (|B| R) / extra
               "rollouts_played": sum(x.get("rollouts", 0) for x in st) + sum(x.get("rollouts", 0) for x in pst),
               "tokens": sum(x.get("gen_tokens", 0) for x in st) + sum(x.get("gen_tokens", 0) for x in pst),
               "invalid": sum(x.get("invalid", 0) for x in st), "truncated": sum(x.get("truncated", 0) for x in st),
               "truncated_share": sum(x.get("truncated", 0) for x in st) / max(sum(x.get("prompts", 0) for x in st), 1),
               "env_errors": sum(x.get("errors", 0) for x in st), "redraws": redraws,
               "sync_err": sync_err, "rank_param_spread": max(c[0] for c in consist) - min(c[0] for c in consist),
               "sched_same_on_ranks": len({c[1] for c in consist}) == 1,
               "t_rollout": t_roll, "t_gen": st[0].get("t_gen", 0.0), "t_env": st[0].get("t_env", 0.0),
               "t_probe": t_probe, "t_train": t_train, "t_sync": t_sync, "t_sched": t_sched, "t_step": time.time() - t0,
               "mem_peak_gb": torch.cuda.max_memory_allocated() / 2**30 if use_cuda else None}
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
                  f"roll {rec['rollouts']}+{rec['probe_rollouts']} tok {rec['tokens']} trunc {rec['truncated_share']:.0%} | "
                  f"t probe {t_probe:.1f} roll {t_roll:.1f} train {t_train:.1f} sync {t_sync:.2f}s")
    # 7. evaluation and checkpoints
    if step + 1 < cfg.steps:
        run_eval(step + 1)
    stopped = all_max(int(stop["flag"]), ddp) > 0  # a signal to any rank stops every rank after the same step
    if stopped or (cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0) or step + 1 == cfg.steps:
        save_checkpoint(step + 1, "signal" if stopped else "periodic")
    if stopped:
        break

# ------------------------------------------------------------------ cleanup
if not stopped:  # the all-reduced decision: a signal arriving after it changes nothing on any rank
    run_eval(cfg.steps)
    if master:  # the run's small record: what run_all.sh keeps and `eval.py table` reads
        summary = {k: v for k, v in run_summary(cfg.out_dir, wall_s=time.time() - t_start).items() if k != "run"}
        json.dump(summary, open(os.path.join(cfg.out_dir, "summary.json"), "w"), indent=1, default=_jsonable)
        print(end_lines(summary, cfg.out_dir))
pool.close()
if master:
    log.close()
# vLLM's own atexit shutdown tears down the process group; destroying it here first would make that fail.
if ddp and not hasattr(engine, "llm"):
    dist.destroy_process_group()
sys.exit(130 if stopped else 0)

"""Agent-G² training: hint-guided GRPO (+ teacher-forced aux loss on the expert prefix) for ALFWorld /
WebShop agents. One file, top to bottom: config, distributed setup, tasks and env pool, models + rollout
engine, the loop, cleanup.

    python train.py                                        # CPU demo (preset cpu): tiny model, built-in games
    python train.py --scheduler none                       # plain GRPO on the same budget
    torchrun --standalone --nproc_per_node=8 train.py --preset paper          # Qwen2.5-1.5B, 8 GPUs
    torchrun --standalone --nproc_per_node=8 train.py --preset paper --model Qwen/Qwen2.5-7B-Instruct \\
        --parallel fsdp
    python train.py --resume auto                          # continue the latest checkpoint in out_dir
    python train.py --help                                 # every flag

One step: the scheduler picks a depth n_i for each of |B| tasks -> each rank plays R rollouts per task of its
shard, after the first n_i actions of the task's hint -> group-normalised advantages -> L = L_GRPO + eta *
L_aux -> AdamW step -> weights synced into the engine -> the scheduler is updated from the batch's success
rates, gathered from all ranks so every rank holds the same scheduler state.
"""
import contextlib
import json
import os
import sys
import time

import numpy as np

from plumbing import ckpt
from config import dump, get_config

t_start = time.time()
# -------------------------------------------------------------- config
cfg = get_config(description=__doc__)  # parse before envs: the PDDL engine overwrites sys.argv
from config import check_data, check_model, check_out_dir, model_error  # noqa: E402

check_model(cfg.model)  # one-line errors (exit 2) before any heavy work
check_data(cfg)
check_out_dir(cfg, clear=os.environ.get("RANK", "0") == "0")

import torch  # noqa: E402  (the heavy imports after the one-line checks)
import torch.distributed as dist  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from envs import EnvPool, env_spec  # noqa: E402
from eval import eval_sets, eval_splits, evals_due, in_loop_eval, write_transcripts  # noqa: E402
from grpo import Update, lr_at, make_advantage, make_terms, needs_reference  # noqa: E402
from rollout import (Reply, group_successes, make_engine, make_hints, make_player,  # noqa: E402
                     seed_all, sync_check)
from scheduler import make_rule  # noqa: E402
from plumbing.parallel import (  # noqa: E402
    all_max, autocast, compute_dtype, fsdp2_shard, init_distributed, local_first, same_on_ranks)
from plumbing.report import end_lines, run_summary, step_line, step_record  # noqa: E402
from plumbing.tasks import (batch_indices, check_step, cluster_warning, length_table, tasks_for,  # noqa: E402
                            train_subset)
from plumbing.tiny import resolve_model  # noqa: E402

# -------------------------------------------------------------- distributed setup
use_cuda = torch.cuda.is_available() and cfg.device != "cpu"
ddp, rank, world, local_rank, device = init_distributed(use_cuda)  # LOCAL_RANK -> device, RANK -> data shard
master = rank == 0  # global rank 0 alone writes logs and checkpoints
if use_cuda and cfg.mem_cap_gb > 0:  # e.g. 80 on a 141 GB card: what an 80 GB card would leave the trainer
    torch.cuda.set_per_process_memory_fraction(
        min(1.0, cfg.mem_cap_gb * 2**30 / torch.cuda.mem_get_info()[1]))
dtype = compute_dtype(cfg.dtype, use_cuda)  # forward passes; the policy's master weights and AdamW stay fp32
old_from_trainer = cfg.old_logprobs == "trainer" or (cfg.old_logprobs == "auto" and use_cuda)

seed_all(cfg.seed + rank)  # sampling differs per rank; data order and scheduler use cfg.seed on every rank


def gather(obj):
    """all_gather_object over ranks (identity without DDP) -> list with one entry per rank."""
    if not ddp:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def in_batch_order(parts, n):
    """Every rank's (batch indices, values) -> one list of the n values in batch order."""
    out = [None] * n
    for indices, values in parts:
        for i, v in zip(indices, values):
            out[i] = v
    return out


# -------------------------------------------------------------- tasks, hints, env pool (before any CUDA work)
train_tasks = train_subset(local_first(lambda: tasks_for(cfg, cfg.train_split, verbose=master),
                                       ddp, local_rank),
                           cfg.train_games)  # each node extracts its own cache, once
cut = lambda ts: [] if cfg.eval_games < 0 else ts[:cfg.eval_games] if cfg.eval_games else ts  # noqa: E731
val_sets = [(name, cut(tasks_for(cfg, split, verbose=master))) for name, split in eval_splits(cfg)]
panel = [train_tasks[i] for i in np.random.default_rng(1234).permutation(len(train_tasks))[:cfg.train_panel]]
hints = make_hints(cfg, train_tasks)  # every prefix comes from it: rollout.ExpertSource or variants/hints.py
reply = Reply(cfg)  # how a reply is read and rewarded (rollout.Reply: its flags)
advantage = make_advantage(cfg, train_tasks, master)  # grpo.GRPO (paper) or variants/advantages.py's


def hint_len(hint):  # L: the length of a hint's actions; None without any (played at depth 0)
    return (len(hint.actions) or None) if hint else None


first_hints = [hints.hint(t) for t in train_tasks]
lengths = [hint_len(h) for h in first_hints]  # L per training task (None: no hint yet)
if master:
    print(length_table(train_tasks))
    print(f"[hints] {cfg.hint_source}: {sum(L is not None for L in lengths)} of {len(train_tasks)} training "
          f"tasks start with a hint to replay, {sum(bool(h and h.text) for h in first_hints)} with a text")
n_eval = max([len(ts) for _, ts in val_sets] + [len(panel)]
             + [cfg.authors_episodes] * (cfg.eval_protocol != "panel"))
pool = EnvPool(cfg.num_workers, env_spec(cfg))

# -------------------------------------------------------------- models, reference, rollout engine, optimizer
model_path = local_first(lambda: resolve_model(cfg), ddp, local_rank)  # 'tiny': built once per node
try:
    tok = AutoTokenizer.from_pretrained(model_path)
    # fp32 master weights read straight onto the device (accelerate): no full host copy a rank (30 GB at 7B)
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, device_map=device)
except (OSError, ValueError) as e:  # a hub id that is not reachable (offline, a typo)
    model_error(cfg.model, e)
check_step(cfg, tok, train_tasks, n_eval, world)  # |B|, episodes per env worker, prompt budget: one line
if cfg.grad_ckpt:
    policy.gradient_checkpointing_enable()
model, fsdp, ref = policy, ddp and cfg.parallel == "fsdp", None
# the reference computes as the policy does (KL 0 at step 0): FSDP2 casts both to bf16; DDP and one
# process use fp32 weights under the same autocast (bf16 weights would keep a bf16 residual stream beside
# the policy's fp32 one)
if needs_reference(cfg):  # the pg term's KL (aux_only and the SFT modes have none)
    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype if fsdp else torch.float32,
                                               device_map=device)
    ref.eval().requires_grad_(False)
if ddp and not fsdp:  # gradients reduced in place (no second copy); no buffers to broadcast each forward
    model = torch.nn.parallel.DistributedDataParallel(policy, device_ids=[local_rank] if use_cuda else None,
                                                      gradient_as_bucket_view=True, broadcast_buffers=False)
elif fsdp:  # FSDP2: every decoder layer, then the root; the reference too (7B: 15 GB in bf16)
    fsdp2_shard(policy, ref, dtype)
seqs = max(-(-cfg.batch_tasks // world) * cfg.group_size, -(-n_eval // world))  # what a rank plays at once
engine = make_engine(cfg, model_path, tok, device, cfg.seed + rank, seqs)
opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                        betas=(cfg.beta1, cfg.beta2))
sched = make_rule(cfg, [t["id"] for t in train_tasks], lengths, cfg.seed, tok)  # G2, or a variant's rule
warning = cluster_warning(lengths, cfg.K) if cfg.cluster_mode == "quantile" else None
if master and warning:  # e.g. lengths 4-7 under K = 3: thresholds [6.0, 6.0], a cluster never holds a task
    print(warning)
player = make_player(cfg, sched, engine, pool, tok, reply, rank, gather)  # who plays a step's groups
# saved in every checkpoint, restored on resume, compared across ranks
run_state = {"sched": sched, "hints": hints}
prec = (lambda: contextlib.nullcontext()) if fsdp else (lambda: autocast(device, dtype))  # FSDP casts itself
terms = make_terms(cfg, ref)  # the loss terms, chosen once: grpo.py's and variants/losses.py's
learn = Update(cfg, model, policy, ref, opt, tok, device, world, ddp, fsdp, prec, old_from_trainer, terms)


def sync_engine():
    """Stream the policy's weights into the engine, one full tensor at a time (FSDP2: each gathered as it is
    consumed, so no rank holds a second full copy of the model). -> their sum, which the ranks compare."""
    total = 0.0

    def tensors():
        nonlocal total
        for name, value in policy.state_dict().items():
            # FSDP2 DTensor: all-gathered
            value = value.full_tensor() if hasattr(value, "full_tensor") else value
            total += value.detach().double().sum().item()
            yield name, value
    engine.load_weights(tensors())
    return total


def save_checkpoint(step, reason):
    """Every rank joins the gathers; rank 0 writes (ckpt.py: atomic, keeps the newest keep_ckpts)."""
    weights, opt_state = ckpt.full_state(policy, opt, fsdp)
    rng = gather(ckpt.rng_state())
    if master:
        state = {name: obj.state_dict() for name, obj in run_state.items()}
        path = ckpt.save(cfg.out_dir, step, policy, tok, weights, {"opt": opt_state, "rng": rng},
                         {"step": step, "reason": reason, "state": state, "redraws": redraws,
                          "wall_s": time.time() - t_start}, cfg, cfg.keep_ckpts)
        print(f"[ckpt] step {step} -> {path} ({reason})")
    if ddp:  # nobody exits (torchrun then stops the others) before rank 0 has finished writing
        dist.barrier()


# -------------------------------------------------------------- resume
start_step, redraws, log_mode = 0, 0, "w"
if cfg.resume:  # weights, AdamW, RNGs and run_state put back (plumbing/ckpt.py)
    start_step, redraws, wall_s = ckpt.resume(cfg, policy, opt, run_state, fsdp, rank, master)
    t_start, log_mode = t_start - wall_s, "a"  # summary.json's wall_s: every process of the run
    sync_engine()

if master:
    os.makedirs(cfg.out_dir, exist_ok=True)
    dump(cfg, os.path.join(cfg.out_dir, "config.json"))
    if cfg.resume:
        ckpt.trim_log(os.path.join(cfg.out_dir, "log.jsonl"), start_step, final=start_step >= cfg.steps)
    log = open(os.path.join(cfg.out_dir, "log.jsonl"), log_mode)
    wandb_run = None
    if cfg.wandb:
        import wandb
        run_config = json.load(open(os.path.join(cfg.out_dir, "config.json")))
        wandb_run = wandb.init(project="agent-g2", config=run_config)
ckpt.catch_signals(rank)  # SIGTERM / SIGINT: every rank stops after the current step, with a checkpoint


def run_eval(step):
    """The hint-free evaluations due at this step (eval.eval_sets: the panel of every validation split and the
    training panel, greedy and sampled; the authors' draw, sampled), with transcripts; none due: nothing."""
    sets = eval_sets(cfg, step, val_sets, panel)
    if not sets:
        return
    res = in_loop_eval(engine, pool, tok, sets, cfg, step, rank, world, gather, reply)
    if master:
        print(f"[eval] step {step}: "
              + "  ".join(f"{k} {100 * v:.1f}%" for k, v in res.items() if k != "counts"))
        log.write(json.dumps({"step": step, "eval": res}) + "\n")
        log.flush()


def scheduler_view(tasks, task_hints):
    """What the scheduler sees of the step's tasks: id, L (None: no hint) and the hint's actions. Each hinted
    task's cluster follows its hint's length (set_length: a no-op unless the hint is new or changed since)."""
    view = [{"id": t["id"], "L": hint_len(h), "actions": h.actions if h else []}
            for t, h in zip(tasks, task_hints)]
    for v in view:
        if v["L"] is not None:
            sched.set_length(v["id"], v["L"])
    return view


# -------------------------------------------------------------- the loop
if start_step == 0:
    run_eval(0)
stopped = False
bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, disable=not master,
           desc="train", dynamic_ncols=True)
for step in bar:
    t0 = time.time()
    lr = lr_at(step, cfg.lr, cfg.steps, cfg.warmup_frac, cfg.lr_schedule)
    for g in opt.param_groups:
        g["lr"] = lr
    # 1. the batch (identical on every rank, the same on resume), one hint per task, a depth per task
    tasks = [train_tasks[i] for i in batch_indices(step, cfg.batch_tasks, len(train_tasks), cfg.seed)]
    task_hints = [hints.hint(t) for t in tasks]  # asked once per task per step
    view = scheduler_view(tasks, task_hints)  # [{"id", "L" (None: no hint), "actions"}]
    mine = list(range(rank, len(tasks), world))  # this rank's shard of the batch
    my_tasks, my_hints = [tasks[i] for i in mine], [task_hints[i] for i in mine]
    t_sched, probe = time.time(), player.prober(step, my_tasks, my_hints, mine)  # None unless the rule probes
    plan = sched.depths(view, step, probe)
    for _ in range(10):  # no task may leave the policy no step: re-draw (bounded: a schedule may be fixed)
        if not player.plays or all(n < cfg.max_steps for n in plan["n"]):
            break
        redraws += 1
        plan = sched.depths(view, step, probe)
    t_probe = player.stats.get("t_total", 0.0)  # probe rules play their groups in step 1
    t_sched = time.time() - t_sched - t_probe
    # 2. rollouts of this rank's shard: R per task after the first n actions of its hint
    t1 = time.time()
    out = player.play(step, my_tasks, my_hints, [plan["n"][i] for i in mine], mine)
    t_roll = time.time() - t1
    # 3. every rank's successes -> one scheduler update (hinted tasks); the hint source learns from all
    flags = in_batch_order(gather((mine, group_successes(out, len(mine)))), len(tasks))  # 0/1 per episode
    p_hat = [sum(f) / len(f) if f else None for f in flags] if player.plays else [float("nan")] * len(tasks)
    if hinted := [i for i, v in enumerate(view) if v["L"] and player.plays]:
        sched.update([tasks[i]["id"] for i in hinted], [p_hat[i] for i in hinted], [flags[i] for i in hinted])
    moved = hints.observe([e for part in gather([{k: e[k] for k in ("task_id", "won", "error", "played")}
                                                 for e in out["episodes"]]) for e in part])  # ids: new hints
    # 4. advantages within each group (--advantage, GRPO's by default), then the loss and the update
    t2 = time.time()
    err = {e["eid"] for e in out["episodes"] if e["error"]}  # error episodes train on nothing
    rows = [r for r in out["rows"] if r["eid"] not in err]
    n_zero, n_groups = advantage(rows, out["episodes"]) if out["episodes"] else (0, 0)
    model.train()
    engine.sleep_mode(True)  # --vllm_sleep (GPU): free the engine's memory during the update
    update = learn.batch(rows, out["aux"])  # the batch's optimizer steps (several with --ppo_mini_batch)
    if stop := learn.stop(update):  # divergence (non-finite weights, an update beyond --max_update): no
        if stop[1]:  # checkpoint; --max_bad_steps non-finite losses in a row (no step taken): one
            save_checkpoint(step, "non-finite loss")
        sys.exit(f"error: step {step}: {stop[0]}; stopped")
    model.eval()
    t_train = time.time() - t2
    # 5. weight sync into the rollout engine, checked on one row; every rank must hold the same state
    t3 = time.time()
    engine.sleep_mode(False)
    weight_sum = sync_engine()
    t_sync = time.time() - t3
    sync_err = sync_check(engine, model, (rows or out["aux"] or [learn.DUMMY])[0], tok.pad_token_id,
                          device, cfg, step, prec)
    consist = same_on_ranks(gather((weight_sum, json.dumps({k: v.state_dict() for k, v in run_state.items()},
                                                           sort_keys=True))), step)  # else: one line, stop
    # 6. log: one dense line (rank 0) + JSONL
    mem_peak_gb = torch.cuda.max_memory_allocated() / 2**30 if use_cuda else None
    times = {"t_rollout": t_roll, "t_probe": t_probe, "t_train": t_train, "t_sync": t_sync,
             "t_sched": t_sched, "mem_peak_gb": mem_peak_gb}
    rec = step_record(step, lr, p_hat, gather((n_zero, n_groups)), update, plan, sched.stats(),
                      (view, task_hints, moved), redraws, sync_err, consist, times, t0,
                      gather((out["stats"], player.stats, len(out["episodes"]), len(err))), tasks)
    rec |= advantage.stats()  # the estimator's own figures (none for GRPO)
    if master:  # a mini-batch skipped for a non-finite loss: a warning on the step line
        log.write(json.dumps(rec, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")
        log.flush()
        bar.write(step_line(rec) + (f" | [warn] non-finite loss: {update['skipped']} mini-batch(es) skipped, "
                                    f"{learn.bad} step(s) in a row" if learn.bad else ""))
        if any(evals_due(cfg, step)):  # two training episodes (rank 0's) at each evaluation step
            write_transcripts(f"{cfg.out_dir}/transcripts/step{step:06d}_train.txt", out, tok, 2)
        if wandb_run:
            wandb_run.log(rec, step=step)
    # 7. evaluation and checkpoints; a signal to any rank stops every rank after the same step
    if step + 1 < cfg.steps:
        run_eval(step + 1)
    stopped = all_max(int(ckpt.stop_requested()), ddp) > 0
    if stopped or (cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0) or step + 1 == cfg.steps:
        save_checkpoint(step + 1, "signal" if stopped else "periodic")
    if stopped:
        break

# -------------------------------------------------------------- cleanup
if not stopped:  # the all-reduced decision: a signal arriving after it changes nothing on any rank
    run_eval(cfg.steps)
    if master:  # the run's small record: what run_all.sh keeps and `eval.py table` reads
        summary = {k: v for k, v in run_summary(cfg.out_dir, wall_s=time.time() - t_start).items()
                   if k != "run"}
        json.dump(summary, open(os.path.join(cfg.out_dir, "summary.json"), "w"), indent=1,
                  default=lambda o: o.item() if hasattr(o, "item") else str(o))
        print(end_lines(summary, cfg.out_dir))
pool.close()
if master:
    log.close()
# vLLM's own atexit shutdown tears down the process group; destroying it here first would make that fail.
if ddp and not hasattr(engine, "llm"):
    dist.destroy_process_group()
sys.exit(130 if stopped else 0)

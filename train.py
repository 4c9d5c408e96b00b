"""Agent-G² training: hint-guided GRPO (+ teacher-forced aux loss on the expert prefix) for ALFWorld /
WebShop agents. One file, top to bottom: config, setup, the update, the loop, cleanup.

    python train.py                                        # CPU demo (preset cpu): tiny model, built-in games
    python train.py --scheduler none                       # plain GRPO on the same budget
    torchrun --standalone --nproc_per_node=8 train.py --preset paper          # Qwen2.5-1.5B, 8 GPUs
    torchrun --standalone --nproc_per_node=8 train.py --preset paper --model Qwen/Qwen2.5-7B-Instruct \\
        --parallel fsdp
    python train.py --resume auto                          # continue the latest checkpoint in out_dir

One step: the scheduler picks a depth n_i for each of |B| tasks -> each rank plays R rollouts per task of its
shard after the first n_i actions of the task's hint -> group-normalised advantages -> L = L_GRPO + eta L_aux
-> AdamW (update_policy) -> weights synced into the engine -> the scheduler updated from the batch's success
rates, gathered from all ranks. README "Read this first": the method tier; the rest is machinery."""
import contextlib
import functools
import json
import os
import sys
import time

if not sys.stderr.isatty():  # progress bars on a terminal only: a log file keeps the step lines alone
    os.environ.setdefault("TQDM_DISABLE", "1")  # before any import of tqdm, which reads it then
from plumbing import ckpt  # noqa: E402
from config import get_config  # noqa: E402

t_start = time.time()
# -------------------------------------------------------------- config
cfg = get_config(description=__doc__)  # parse before envs: the PDDL engine overwrites sys.argv
from config import check_data, check_model, check_out_dir  # noqa: E402

check_model(cfg.model)  # one-line errors (exit 2) before any heavy work
check_data(cfg)
check_out_dir(cfg, clear=os.environ.get("RANK", "0") == "0")

import torch  # noqa: E402  (the heavy imports after the one-line checks)
import torch.distributed as dist  # noqa: E402
from tqdm import tqdm  # noqa: E402

from envs import EnvPool, env_spec  # noqa: E402
from eval import eval_sets, eval_tasks, evals_due, in_loop_eval, write_transcripts  # noqa: E402
from grpo import (MicroBatch, batch_counts, forward_rows, lr_at, make_advantage, make_terms,  # noqa: E402
                  micro_batches, mini_batches, needs_reference, response_logprobs, terms_loss)
from rollout import (Reply, group_successes, make_engine, make_hints, make_player,  # noqa: E402
                     seed_all, sync_check)
from scheduler import make_rule  # noqa: E402
from plumbing.parallel import (  # noqa: E402
    all_max, autocast, cap_memory, compute_dtype, gather_objects, in_batch_order, init_distributed,
    local_first, load_policy, same_on_ranks, stream_weights, wrap_models)
from plumbing.lockstep import Ranks, check_terms  # noqa: E402
from plumbing.report import end_lines, open_log, step_line, step_record, write_summary  # noqa: E402
from plumbing.plugins import plugin_stats  # noqa: E402
from plumbing.tasks import check_step, make_sampler, start_lines, tasks_for, train_subset  # noqa: E402
from plumbing.tiny import resolve_model  # noqa: E402

# -------------------------------------------------------------- distributed setup
use_cuda = torch.cuda.is_available() and cfg.device != "cpu"
ddp, rank, world, local_rank, device = init_distributed(use_cuda)  # LOCAL_RANK -> device, RANK -> data shard
master = rank == 0  # global rank 0 alone writes logs and checkpoints
cap_memory(cfg.mem_cap_gb if use_cuda else 0)  # --mem_cap_gb: what an 80 GB card would leave the trainer
dtype = compute_dtype(cfg.dtype, use_cuda)  # forward passes; the policy's master weights and AdamW stay fp32
old_from_trainer = cfg.old_logprobs == "trainer" or (cfg.old_logprobs == "auto" and use_cuda)

seed_all(cfg.seed + rank)  # sampling differs per rank; data order and scheduler use cfg.seed on every rank
gather = functools.partial(gather_objects, ddp=ddp, world=world)  # obj -> [obj of each rank]

# -------------------------------------------------------------- tasks, hints, env pool (before any CUDA work)
train_tasks = train_subset(local_first(lambda: tasks_for(cfg, cfg.train_split, verbose=master),
                                       ddp, local_rank),
                           cfg.train_games)  # each node extracts its own cache, once
val_sets, panel, n_eval = eval_tasks(cfg, train_tasks, master)  # hint-free: each split's games, a train panel
hints = make_hints(cfg, train_tasks)  # every prefix comes from it: rollout.ExpertSource or variants/hints.py
reply = Reply(cfg)  # how a reply is read (rollout.Reply) and rewarded (.rewards: rollout.Reward, --reward)
advantage = make_advantage(cfg, train_tasks, master)  # grpo.GRPO (paper) or variants/advantages.py's
sampler = make_sampler(cfg, train_tasks)  # the batch's tasks: plumbing.tasks.BatchOrder or --task_sampler's


def hint_len(hint):  # L: the length of a hint's actions; None without any (played at depth 0)
    return (len(hint.actions) or None) if hint else None


first_hints = [hints.hint(t) for t in train_tasks]
lengths = [hint_len(h) for h in first_hints]  # L per training task (None: no hint yet)
if master:  # the expert lengths, how many tasks start with a hint; K clusters that leave one empty: a warning
    print(start_lines(cfg, train_tasks, first_hints, lengths))
pool = EnvPool(cfg.num_workers, env_spec(cfg))

# -------------------------------------------------------------- models, reference, rollout engine, optimizer
model_path = local_first(lambda: resolve_model(cfg), ddp, local_rank)  # 'tiny': built once per node
tok, policy = load_policy(cfg, model_path, device)  # fp32 master weights; an unreachable model: one line
check_step(cfg, tok, train_tasks, n_eval, world)  # |B|, episodes per env worker, prompt budget: one line
fsdp = ddp and cfg.parallel == "fsdp"
# model: what the forward runs (the DDP wrapper, or the policy itself); ref: the KL's reference, or None
model, ref = wrap_models(cfg, policy, model_path, device, dtype, ddp, fsdp, use_cuda, local_rank,
                         needs_reference(cfg))
seqs = max(-(-cfg.batch_tasks // world) * cfg.group_size, -(-n_eval // world))  # what a rank plays at once
engine = make_engine(cfg, model_path, tok, device, cfg.seed + rank, seqs)
opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                        betas=(cfg.beta1, cfg.beta2))
rule = make_rule(cfg, [t["id"] for t in train_tasks], lengths, cfg.seed, tok)  # G2, or a variant's rule
player = make_player(cfg, rule, engine, pool, tok, reply, rank, gather)  # who plays a step's groups
# saved in every checkpoint, restored on resume, compared across ranks
run_state = {"sched": rule, "hints": hints, "sampler": sampler}  # keys as checkpoints save them
checkpoint = functools.partial(ckpt.checkpoint, cfg=cfg, policy=policy, opt=opt, tok=tok, run_state=run_state,
                               fsdp=fsdp, gather=gather, master=master, ddp=ddp)  # (step, why, redraws, s)
prec = (lambda: contextlib.nullcontext()) if fsdp else (lambda: autocast(device, dtype))  # FSDP casts itself
terms = make_terms(cfg, ref)  # the loss terms, chosen once: grpo.py's and variants/losses.py's
by_rows = check_terms(terms)  # {"step": the terms reading step rows, "aux": those reading expert rows}
score = functools.partial(response_logprobs, pad_id=tok.pad_token_id, device=device,
                          temperature=cfg.temperature, pack=cfg.pack_tokens)  # (model, rows) -> lp, mask
old_key, ref_lp = "old_lp" if old_from_trainer else "logprobs", ref and (lambda rows: score(ref, rows)[0])
ranks = Ranks(cfg, model, policy, ref, terms, score, ddp, fsdp, world, prec, old_from_trainer,
              {"prompt_ids": [tok.eos_token_id], "response_ids": [tok.eos_token_id]})  # keeps ranks in step


def update_policy(rows, aux):
    """The batch's update, as one process runs it: mini-batches (one AdamW step each, the same cut on 1 GPU or
    8) -> micro-batches -> log-probs -> the loss terms -> backward -> the clipped optimizer step. `ranks`
    (plumbing/lockstep.py) keeps ranks in step: global counts, as many passes on every rank, one gradient
    reduction, world x the loss for DDP's average. -> the logged values (pg, kl, aux, ..., grad_norm)."""
    n_mb = max(1, -(-ranks.sum(len(rows)) // cfg.ppo_mini_batch)) if cfg.ppo_mini_batch else 1
    minis = list(zip(mini_batches(rows, n_mb), mini_batches(aux, n_mb)))  # (step rows, aux rows) each
    tally = ranks.tally(rows, [mb for mb, _ in minis])  # the logged sums; pi_old first if the trainer scores
    for mb, aux_mb in minis:
        counts, ep_tok = batch_counts(mb, aux_mb)
        counts = ranks.total(counts)  # the mini-batch's global counts: what the loss is normalised by
        opt.zero_grad(set_to_none=ranks.set_to_none)
        work = [("step", m) for m in micro_batches(forward_rows(mb, terms), cfg)] if by_rows["step"] else []
        work += [("aux", m) for m in micro_batches(aux_mb, cfg)] if by_rows["aux"] else []
        stats = tally.new()  # the terms' stats over this mini-batch's micro-batches
        for kind, micro in ranks.passes(work):  # then zero-loss passes, as many as the busiest rank runs
            with prec():  # bf16 compute over the fp32 weights
                lp, mask, *entropy = score(model, micro, entropy=any(t.entropy for t in by_rows[kind]))
                batch = MicroBatch(micro, lp, mask, (entropy or [None])[0], counts, ep_tok, old_key, ref_lp)
                loss = terms_loss(by_rows[kind], batch, stats)
            ranks.backward(loss, batch)  # world x loss; a non-finite loss stops the step on every rank
        grad_norm = ranks.clip_grad_norm(cfg.grad_clip)  # nan: a loss was not finite, no step
        if grad_norm > 0:  # zero: no signal, no step (Adam would turn a zero gradient into a full-size move)
            opt.step()
        tally.add(stats, grad_norm, ranks.update_size(opt) if grad_norm > 0 else 0.0)
    return tally.summary(n_mb)


# -------------------------------------------------------------- resume
start_step, redraws, log_mode = 0, 0, "w"
if cfg.resume:  # weights, AdamW, RNGs and run_state put back (plumbing/ckpt.py)
    start_step, redraws, wall_s = ckpt.resume(cfg, policy, opt, run_state, fsdp, rank, master)
    t_start, log_mode = t_start - wall_s, "a"  # summary.json's wall_s: every process of the run
    stream_weights(policy, engine)

log, wandb_run = open_log(cfg, start_step, log_mode) if master else (None, None)  # config.json too
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
            rule.set_length(v["id"], v["L"])
    return view


def draw_depths(view, step, probe):
    """The rule's depths for the step's tasks; a task whose prefix would leave the policy no step (n >=
    --max_steps) is drawn again, it alone, up to 10 times (a fixed rule draws the same) -> (plan, redraws)"""
    plan, tries = rule.depths(view, step, probe), 0
    while tries < 10 and player.plays:
        if not (over := [i for i, n in enumerate(plan["n"]) if n >= cfg.max_steps]):
            break
        again, tries = rule.depths(view, step, probe), tries + 1
        for i in over:
            plan["n"][i], plan["r"][i] = again["n"][i], again["r"][i]
        plan["probe_rollouts"] += again["probe_rollouts"]
    return plan, tries


# -------------------------------------------------------------- the loop
if start_step == 0:
    run_eval(0)
stopped = False
bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, desc="train",
           dynamic_ncols=True, disable=not (master and sys.stderr.isatty()))  # a log file: the lines alone
for step in bar:
    t0 = time.time()
    lr = lr_at(step, cfg.lr, cfg.steps, cfg.warmup_frac, cfg.lr_schedule)
    for g in opt.param_groups:
        g["lr"] = lr
    # 1. the batch (identical on every rank, the same on resume), one hint per task, a depth per task
    tasks = [train_tasks[i] for i in sampler.batch(step)]
    task_hints = [hints.hint(t) for t in tasks]  # asked once per task per step
    view = scheduler_view(tasks, task_hints)  # [{"id", "L" (None: no hint), "actions"}]
    mine = list(range(rank, len(tasks), world))  # this rank's shard of the batch
    my_tasks, my_hints = [tasks[i] for i in mine], [task_hints[i] for i in mine]
    t_sched, probe = time.time(), player.prober(step, my_tasks, my_hints, mine)  # None unless the rule probes
    plan, tries = draw_depths(view, step, probe)  # {"n": depth per task, "r": its ratio, "probe_rollouts"}
    redraws += tries
    t_probe = player.stats.get("t_total", 0.0)  # probe rules play their groups in step 1
    t_sched = time.time() - t_sched - t_probe
    # 2. rollouts of this rank's shard: R per task after the first n actions of its hint
    t1 = time.time()
    out = player.play(step, my_tasks, my_hints, [plan["n"][i] for i in mine], mine)
    t_roll = time.time() - t1
    # 3. every rank's successes -> one scheduler update (hinted tasks); the hint source learns from all
    flags = in_batch_order(gather((mine, group_successes(out, len(mine)))), len(tasks))  # 0/1 per episode
    p_hat = [sum(f) / len(f) if f and player.plays else None for f in flags]  # None: no kept outcome
    if hinted := [i for i, v in enumerate(view) if v["L"] and player.plays]:
        rule.update([tasks[i]["id"] for i in hinted], [p_hat[i] for i in hinted], [flags[i] for i in hinted])
    sampler.observe([t["id"] for t in tasks], p_hat)  # every task's outcome, for the next batches
    moved = hints.observe([e for part in gather([{k: e[k] for k in ("task_id", "won", "error", "played")}
                                                 for e in out["episodes"]]) for e in part])  # ids: new hints
    # 4. advantages within each group (--advantage, GRPO's by default), then the loss and the update
    t2 = time.time()
    err = {e["eid"] for e in out["episodes"] if e["error"]}  # error episodes train on nothing
    rows = [r for r in out["rows"] if r["eid"] not in err]
    n_zero, n_groups = advantage(rows, out["episodes"]) if out["episodes"] else (0, 0)
    model.train()
    engine.sleep_mode(True)  # --vllm_sleep (GPU): free the engine's memory during the update
    update = update_policy(rows, out["aux"])  # the batch's optimizer steps (several with --ppo_mini_batch)
    if stop := ranks.stop(update):  # divergence (non-finite weights, an update beyond --max_update): no
        if stop[1]:  # checkpoint; --max_bad_steps non-finite losses in a row (no step taken): one
            checkpoint(step, "non-finite loss", redraws, time.time() - t_start)
        sys.exit(f"error: step {step}: {stop[0]}; stopped")
    model.eval()
    t_train = time.time() - t2
    # 5. weight sync into the rollout engine, checked on one row; every rank must hold the same state
    t3 = time.time()
    engine.sleep_mode(False)
    weight_sum = stream_weights(policy, engine)
    t_sync = time.time() - t3
    sync_err = sync_check(engine, model, (rows or out["aux"] or [ranks.dummy])[0], tok.pad_token_id,
                          device, cfg, step, prec)
    consist = same_on_ranks(gather((weight_sum, json.dumps({k: v.state_dict() for k, v in run_state.items()},
                                                           sort_keys=True))), step)  # else: one line, stop
    # 6. log: one dense line (rank 0) + JSONL
    mem_peak_gb = torch.cuda.max_memory_allocated() / 2**30 if use_cuda else None
    times = {"t_rollout": t_roll, "t_probe": t_probe, "t_train": t_train, "t_sync": t_sync,
             "t_sched": t_sched, "mem_peak_gb": mem_peak_gb}
    per_rank = gather({"zero_adv_groups": n_zero, "groups": n_groups, "rollout": out["stats"],
                       "probe": player.stats, "episodes": len(out["episodes"]), "errors": len(err)})
    rec = step_record(step=step, lr=lr, tasks=tasks, p_hat=p_hat, plan=plan, rule_stats=rule.stats(),
                      update=update, view=view, task_hints=task_hints, moved=moved, redraws=redraws,
                      sync_err=sync_err, consist=consist, times=times, t0=t0, per_rank=per_rank)
    rec |= advantage.stats() | plugin_stats(dict(task_sampler=sampler, reward=reply.rewards, hints=hints))
    if master:  # a mini-batch skipped for a non-finite loss: a warning on the step line
        log.write(json.dumps(rec, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")
        log.flush()
        bar.write(step_line(rec) + (f" | [warn] non-finite loss: {update['skipped']} mini-batch(es) skipped, "
                                    f"{ranks.bad} step(s) in a row" if ranks.bad else ""))
        if any(evals_due(cfg, step)):  # two training episodes (rank 0's) at each evaluation step
            write_transcripts(f"{cfg.out_dir}/transcripts/step{step:06d}_train.txt", out, tok, 2)
        if wandb_run:
            wandb_run.log(rec, step=step)
    # 7. evaluation and checkpoints; a signal to any rank stops every rank after the same step
    if step + 1 < cfg.steps:
        run_eval(step + 1)
    stopped = all_max(int(ckpt.stop_requested()), ddp) > 0
    if stopped or (cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0) or step + 1 == cfg.steps:
        checkpoint(step + 1, "signal" if stopped else "periodic", redraws, time.time() - t_start)
    if stopped:
        break

# -------------------------------------------------------------- cleanup
if not stopped:  # the all-reduced decision: a signal arriving after it changes nothing on any rank
    run_eval(cfg.steps)
    if master:  # summary.json, the run's small record: what run_all.sh keeps and `eval.py table` reads
        print(end_lines(write_summary(cfg.out_dir, time.time() - t_start), cfg.out_dir))
pool.close()
if master:
    log.close()
# vLLM's own atexit shutdown tears down the process group; destroying it here first would make that fail.
if ddp and not hasattr(engine, "llm"):
    dist.destroy_process_group()
sys.exit(130 if stopped else 0)

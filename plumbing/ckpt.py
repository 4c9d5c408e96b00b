"""Checkpoints of train.py: one Hugging Face directory per checkpoint, written atomically,
read back on resume.

Contract. checkpoint(step, reason, ...) writes ckpt_<step> atomically (a crash leaves a .tmp, never listed);
resume(cfg, ...) puts back weights, AdamW, every rank's RNGs and the run state: the resumed run's records
equal an uninterrupted run's (tests/test_train.py). Non-finite weights are never written.

    out_dir/ckpt_000020/   config.json, generation_config.json, model.safetensors, tokenizer files
                           (a plain HF checkpoint: loads in transformers and vLLM)
                           trainer.pt   {"opt": optimizer state,
                                         "rng": [per-rank python/numpy/torch RNG states]}
                           state.json   {"step", "reason", "redraws", "state" (train.py's run
                                         state: {"sched", "hints", ...}), "wall_s" (seconds so far,
                                         over every resumed process)}
                           config.json.run (the run's full flag set), COMPLETE (written last)

    python train.py --resume auto            # the newest complete checkpoint in --out_dir
    python train.py --resume DIR             # that one

save() takes the full (unsharded) weights and optimizer state (full_state gathers FSDP2's shards);
resume() puts a checkpoint back into the policy, AdamW, the RNGs and train.py's run state under DDP, FSDP
or one process.
catch_signals() / stop_requested(): SIGTERM or SIGINT ends a run after its step, with a checkpoint.
"""
import dataclasses
import json
import os
import random
import shutil
import signal
import sys

import numpy as np
import torch

from config import dump


def rng_state():
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(r):
    random.setstate(r["python"])
    np.random.set_state(r["numpy"])
    torch.set_rng_state(r["torch"])


def full_state(policy, opt, fsdp):
    """-> (weights, optimizer state) whole, for save(): FSDP2's shards gathered into rank 0's RAM."""
    if not fsdp:
        return policy.state_dict(), opt.state_dict()
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(policy, options=full), get_optimizer_state_dict(policy, opt, options=full)


def save(out_dir, step, policy, tok, weights, trainer, state, cfg, keep):
    """Write ckpt_<step>.tmp, mark it COMPLETE, rename; keep the newest `keep` (<= 0: all). -> the path."""
    if bad := [k for k, t in (weights or {}).items() if t.is_floating_point() and not t.isfinite().all()]:
        raise ValueError(f"checkpoint at step {step} not written: non-finite values in {bad[:3]}")
    final = os.path.join(out_dir, f"ckpt_{step:06d}")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tok.save_pretrained(tmp)
    torch.save(trainer, os.path.join(tmp, "trainer.pt"))
    json.dump(state, open(os.path.join(tmp, "state.json"), "w"))
    dump(cfg, os.path.join(tmp, "config.json.run"))
    open(os.path.join(tmp, "COMPLETE"), "w").write(state.get("reason", ""))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    # the one just written is never pruned; a directory without COMPLETE is not ours and stays
    others = [d for d in complete(out_dir) if d != final]
    for d in others[:max(0, len(others) - (keep - 1))] if keep > 0 else []:
        shutil.rmtree(d, ignore_errors=True)
    return final


def checkpoint(step, reason, redraws, wall_s, cfg, policy, opt, tok, run_state, fsdp, gather, master, ddp):
    """train.py's checkpoint: every rank joins the gathers (FSDP2's shards, the RNG states); rank 0 writes
    (save: atomic, keeps the newest --keep_ckpts) the weights, AdamW, every rank's RNGs, run_state's
    state_dicts, the re-draw count and the run's seconds so far."""
    weights, opt_state = full_state(policy, opt, fsdp)
    rng = gather(rng_state())
    if master:
        state = {name: obj.state_dict() for name, obj in run_state.items()}
        path = save(cfg.out_dir, step, policy, tok, weights, {"opt": opt_state, "rng": rng},
                    {"step": step, "reason": reason, "state": state, "redraws": redraws, "wall_s": wall_s},
                    cfg, cfg.keep_ckpts)
        print(f"[ckpt] step {step} -> {path} ({reason})")
    if ddp:  # nobody exits (torchrun then stops the others) before rank 0 has finished writing
        torch.distributed.barrier()


def complete(d):
    """The complete checkpoints under d, oldest first. A crash mid-save leaves a ckpt_*.tmp, never listed."""
    return [os.path.join(d, x) for x in sorted(os.listdir(d))
            if x.startswith("ckpt_") and not x.endswith(".tmp")
            and os.path.exists(os.path.join(d, x, "COMPLETE"))] if os.path.isdir(d) else []


def latest(d):
    """Newest complete checkpoint under d, or None."""
    c = complete(d)
    return c[-1] if c else None


def trim_log(path, step, final=False):
    """On resume at `step`: drop what a crashed process logged past its last checkpoint, so no step is
    logged twice. Kept, verbatim: training records of steps < step, and the eval at `step`, which precedes
    its checkpoint unless that checkpoint is the run's last (final=True: train.py evaluates after it, and
    will again)."""
    if not os.path.exists(path):
        return
    lines = [x for x in open(path) if x.strip()]
    recs = [json.loads(x) for x in lines]
    keep = [x for x, r in zip(lines, recs)
            if r["step"] < step or ("eval" in r and r["step"] == step and not final)]
    with open(path, "w") as f:
        f.writelines(keep)


# bookkeeping a resumed run may change without changing what it trains: never reported by changed_flags
RESUME_FREE = {"argv", "git_commit", "resume", "overwrite", "steps", "num_workers", "ckpt_every",
               "keep_ckpts", "wandb", "vllm_log", "cache_dir"}


def changed_flags(path, cfg):
    """The flags whose value differs from the ones checkpoint `path` was trained with:
    ["lr: 0.0001 -> 0.0005", ...]. A resumed run with other flags trains a different experiment from its
    checkpoint on; train.py warns."""
    f = os.path.join(path, "config.json.run")
    if not os.path.exists(f):
        return []
    # tuples -> lists, as dumped
    old, new = json.load(open(f)), json.loads(json.dumps(dataclasses.asdict(cfg)))
    return [f"{k}: {old[k]!r} -> {new[k]!r}"
            for k in sorted(set(old) & set(new) - RESUME_FREE) if old[k] != new[k]]


def unreadable(path):
    """Why checkpoint `path` cannot be resumed from (a file missing, or model.safetensors shorter or longer
    than its header says: a copy cut short), or None. Reads the safetensors header only: 8 bytes of length,
    then a JSON header whose data_offsets end where the file must end."""
    for f in ("model.safetensors", "trainer.pt", "state.json"):
        if not os.path.exists(os.path.join(path, f)):
            return f"{os.path.join(path, f)} is missing"
    f = os.path.join(path, "model.safetensors")
    size = os.path.getsize(f)
    try:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n)) if 8 + n <= size else None
        end = max([v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] + [0])
    except (ValueError, TypeError, AttributeError, KeyError):
        return f"{f} is unreadable (no safetensors header)"
    if size != 8 + n + end:
        return f"{f} is unreadable ({size} bytes, its header says {8 + n + end})"
    return None


def load(resume, out_dir, tie_word_embeddings, weights=True):
    """--resume auto|DIR -> (path, weights, trainer, state); exits with a one-line error when none is
    complete. auto: the newest complete checkpoint that is readable, saying in one line which newer one is
    not. weights=False (FSDP ranks > 0, which receive rank 0's copy by broadcast): weights {} and
    trainer["opt"] {}. trainer.pt is memory-mapped, so a rank reads only what it touches (its RNG state, not
    the optimizer's)."""
    tries = complete(out_dir) if resume == "auto" else [resume]  # oldest first
    if not tries or not os.path.exists(os.path.join(tries[-1], "COMPLETE")):
        sys.exit(f"error: --resume {resume}: no complete checkpoint found")
    for path in reversed(tries):
        if (why := unreadable(path)) is None:
            break
        if resume == "auto":
            print(f"warning: --resume auto: {why}; trying the checkpoint before it", file=sys.stderr)
    else:
        sys.exit(f"error: --resume {resume}: {why}; no readable checkpoint to resume from")
    from safetensors.torch import load_file
    sd = load_file(os.path.join(path, "model.safetensors")) if weights else {}
    if weights and "lm_head.weight" not in sd and tie_word_embeddings:  # save_pretrained drops the tied copy
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    trainer = torch.load(os.path.join(path, "trainer.pt"), map_location="cpu", weights_only=False, mmap=True)
    if not weights:
        trainer["opt"] = {}
    return path, sd, trainer, json.load(open(os.path.join(path, "state.json")))


def resume(cfg, policy, opt, run_state, fsdp, rank, master):
    """--resume: the checkpoint's weights, AdamW state, this rank's RNG states and the run state ({name:
    object with state_dict / load_state_dict}) put back in place. Under FSDP rank 0 reads the files and
    broadcasts (8 host copies of a 7B model and its AdamW state would not fit). Warns about flags that changed
    since (a silent change would splice two experiments into one run). -> (step, redraws, wall_s so far)."""
    path, weights, trainer, saved = load(cfg.resume, cfg.out_dir, policy.config.tie_word_embeddings,
                                         not fsdp or master)
    if fsdp:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        from_rank0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(policy, weights, options=from_rank0)
        set_optimizer_state_dict(policy, opt, trainer["opt"], options=from_rank0)
    else:
        policy.load_state_dict(weights)
        opt.load_state_dict(trainer["opt"])
    set_rng_state(trainer["rng"][rank] if rank < len(trainer["rng"]) else trainer["rng"][0])
    for name, obj in run_state.items():
        if name in saved.get("state", {}):
            obj.load_state_dict(saved["state"][name])
        elif master:
            print(f"[resume] warning: {path} holds no '{name}' state; it starts afresh")
    if master:
        print(f"[resume] {path}: continuing at step {saved['step']}")
        for change in changed_flags(path, cfg):
            print(f"[resume] warning: the checkpoint was trained with other flags, {change}")
    return saved["step"], saved["redraws"], saved.get("wall_s", 0.0)


_stop_requested = False  # set by the first SIGTERM / SIGINT


def catch_signals(rank):
    """SIGTERM / SIGINT: finish the current step, checkpoint, exit (train.py asks stop_requested() after each
    step, all-reduced so every rank stops after the same one); a second signal aborts at once."""
    global _stop_requested
    _stop_requested = False

    def on_signal(signum, frame):
        global _stop_requested
        if _stop_requested:
            raise KeyboardInterrupt
        _stop_requested = True
        print(f"\n[rank {rank}: signal {signum}] every rank stops after this step; a checkpoint will be "
              "written")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def stop_requested():
    return _stop_requested

"""Distributed setup and precision for train.py: process groups, fp32 master weights under bf16 compute, and the
per-rank memory arithmetic of the GPU presets.

    ddp, rank, world, local_rank, device = init_distributed(use_cuda)   # torchrun env -> process group
    ctx = autocast(device, compute_dtype)                                 # bf16 forward over fp32 weights
    python parallel.py memory                                             # the memory table of docs/gpu.md

Process groups: on CUDA, one group with two backends ("cpu:gloo,cuda:nccl"), so CPU tensors (step counts, stop
flags, update sizes) and all_gather_object go over gloo and CUDA tensors (DDP/FSDP gradients) over NCCL. On CPU,
gloo alone. The timeout is long because one rank's rollouts can keep the others waiting for minutes.
Ranks: LOCAL_RANK picks the device, RANK / WORLD_SIZE split the data, global rank 0 writes logs and checkpoints;
node-local caches (the tiny model, extracted games) are built by each node's local rank 0 first (`local_first`).
"""
import contextlib
import datetime
import os
import sys

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(hours=2)


def backend(use_cuda):
    """The process-group backend string: gloo for CPU tensors always, NCCL for CUDA tensors on GPU."""
    return "cpu:gloo,cuda:nccl" if use_cuda else "gloo"


def init_distributed(use_cuda):
    """-> (ddp, rank, world, local_rank, device). Reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK."""
    ddp = int(os.environ.get("RANK", -1)) != -1
    local_rank = int(os.environ.get("LOCAL_RANK", 0)) if ddp else 0
    if use_cuda:
        torch.cuda.set_device(local_rank)  # before NCCL: otherwise every rank's buffers land on cuda:0
    if not ddp:
        return False, 0, 1, 0, "cuda:0" if use_cuda else "cpu"
    dist.init_process_group(backend(use_cuda), timeout=TIMEOUT,
                            device_id=torch.device("cuda", local_rank) if use_cuda else None)
    return True, dist.get_rank(), dist.get_world_size(), local_rank, f"cuda:{local_rank}" if use_cuda else "cpu"


def local_first(fn, ddp, local_rank):
    """Run fn on each node's local rank 0 first (it fills node-local caches), then on the node's other ranks."""
    if ddp and local_rank != 0:
        dist.barrier()
    out = fn()
    if ddp and local_rank == 0:
        dist.barrier()
    return out


def all_max(n, ddp):
    """The largest int n over ranks (a CPU tensor: gloo); n itself without a process group."""
    t = torch.tensor([n])
    if ddp:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def compute_dtype(name, use_cuda):
    """--dtype: the compute dtype of the forward passes (the policy's master weights stay fp32)."""
    if name == "auto":
        return torch.bfloat16 if use_cuda else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def autocast(device, dtype):
    """bf16 autocast over fp32 weights (DDP / single process); a no-op in fp32. AdamW then keeps fp32 moments
    and fp32 weights: in bf16, an update of lr 1e-6 on a weight of 0.02 (spacing 1.2e-4) rounds away."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.split(":")[0], dtype=dtype)


# ---------------------------------------------------------------------------------------------------------------
# Per-rank memory by arithmetic (not measured): python parallel.py memory
# ---------------------------------------------------------------------------------------------------------------
QWEN = {"1.5B": dict(params=1.54e9, layers=28, hidden=1536, kv_heads=2, head_dim=128, vocab=151936),
        "7B": dict(params=7.62e9, layers=28, hidden=3584, kv_heads=4, head_dim=128, vocab=152064)}


def memory_gb(size, world=8, fsdp=False, seqs=16, seq_len=2560, micro_batch=8, resp_len=512, kv_gb=None):
    """Per-rank GB: fp32 master weights (4 B/param), fp32 grads (4), AdamW moments (8), a bf16 reference (2),
    vLLM's bf16 weights + KV cache, and activations of one micro-batch under gradient checkpointing (the layer
    inputs, bf16, plus fp32 logits of the response positions only). FSDP shards all but vLLM and activations.
    seqs: sequences a rank rolls out at once (|B| R / world); KV = 2 (K, V) x layers x kv_heads x head_dim x 2 B
    per token."""
    m = QWEN[size]
    P, shard = m["params"], (world if fsdp else 1)
    kv = kv_gb if kv_gb is not None else \
        seqs * seq_len * 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * 2 / 2**30
    act = (micro_batch * seq_len * m["hidden"] * 2 * m["layers"]  # checkpointed layer inputs, bf16
           + micro_batch * resp_len * m["vocab"] * 4 * 2) / 2**30  # response logits fp32 + their grad
    row = {"weights (fp32)": 4 * P / shard, "grads (fp32)": 4 * P / shard, "AdamW m, v (fp32)": 8 * P / shard,
           "reference (bf16)": 2 * P / shard}
    row = {k: v / 2**30 for k, v in row.items()}
    row["vLLM weights (bf16)"] = 2 * P / 2**30
    row["vLLM KV cache"] = kv
    row["activations (1 micro-batch)"] = act
    row["total"] = sum(row.values())
    return row


def memory_table():
    cols = [("1.5B", False), ("7B", True)]
    rows = {k: [memory_gb(s, fsdp=f, kv_gb=2.0)[k] for s, f in cols] for k in memory_gb("1.5B")}  # presets: 2 GiB KV
    out = ["| per rank, GB (8 ranks) | Qwen2.5-1.5B, DDP | Qwen2.5-7B, FSDP2 |", "|---|---:|---:|"]
    out += [f"| {k} | {a:.1f} | {b:.1f} |" for k, (a, b) in rows.items()]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["memory"]:
        print(memory_table())
    else:
        sys.exit("usage: python parallel.py memory")

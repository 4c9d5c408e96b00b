"""Distributed setup and precision for train.py: process groups, fp32 master weights under bf16 compute, and
the per-rank memory arithmetic of the GPU presets.

Contract. all_max / all_sum / reduce_dict / gather_objects: the value over ranks (the value itself alone);
same_on_ranks stops the run with one line naming the first difference when ranks disagree; stream_weights
feeds the engine every tensor of the policy, whole, one at a time; autocast: bf16 compute over fp32 weights.

    ddp, rank, world, local_rank, device = init_distributed(use_cuda)   # torchrun env -> process group
    ctx = autocast(device, compute_dtype)                                 # bf16 forward over fp32 weights
    python -m plumbing.parallel memory                                    # the memory table of docs/gpu.md

Process groups: on CUDA, one group with two backends ("cpu:gloo,cuda:nccl"), so CPU tensors (step counts, stop
flags, update sizes) and all_gather_object go over gloo and CUDA tensors (DDP/FSDP gradients) over NCCL. On
CPU, gloo alone. The timeout is long because one rank's rollouts can keep the others waiting for minutes.
Ranks: LOCAL_RANK picks the device, RANK / WORLD_SIZE split the data, global rank 0 writes logs and
checkpoints; node-local caches (the tiny model, extracted games) are built by each node's local rank 0 first
(`local_first`).
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
    return (True, dist.get_rank(), dist.get_world_size(), local_rank,
            f"cuda:{local_rank}" if use_cuda else "cpu")


def cap_memory(gb):
    """Cap this process's CUDA memory at `gb` GiB (e.g. 80 on a 141 GB card: what an 80 GB card would leave
    the trainer); 0: no cap."""
    if gb > 0:
        torch.cuda.set_per_process_memory_fraction(min(1.0, gb * 2**30 / torch.cuda.mem_get_info()[1]))


def local_first(fn, ddp, local_rank):
    """Run fn on each node's local rank 0 first (it fills node-local caches),
    then on the node's other ranks."""
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


def all_sum(n, ddp):
    """The sum of int n over ranks (a CPU tensor: gloo); n itself without a process group."""
    t = torch.tensor([n])
    if ddp:
        dist.all_reduce(t)
    return int(t.item())


def reduce_dict(values, ddp, op="sum"):
    """{name: number} summed (op "max": maxed) over ranks as floats in one all-reduce (sorted keys: the same
    layout on every rank); the values themselves without a process group."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    if ddp:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist()))


def gather_objects(obj, ddp=False, world=1):
    """all_gather_object over ranks -> a list with one entry per rank ([obj] without a process group)."""
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


def stream_weights(policy, engine):
    """Stream the policy's weights into the rollout engine, one full tensor at a time (FSDP2: each gathered
    as it is consumed, so no rank holds a second full copy of the model). -> their sum, which the ranks
    compare."""
    total = 0.0

    def tensors():
        nonlocal total
        for name, value in policy.state_dict().items():
            value = value.full_tensor() if hasattr(value, "full_tensor") else value  # FSDP2 DTensor: gathered
            total += value.detach().double().sum().item()
            yield name, value
    engine.load_weights(tensors())
    return total


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


def load_policy(cfg, model_path, device):
    """-> (tokenizer, policy): fp32 master weights read straight onto the device (accelerate: no host copy
    a rank, 30 GB at 7B); a hub id that is not reachable (offline, a typo): one line, exit 2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from config import model_error
    try:
        return (AutoTokenizer.from_pretrained(model_path),
                AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, device_map=device))
    except (OSError, ValueError) as e:
        model_error(cfg.model, e)


def wrap_models(cfg, policy, model_path, device, dtype, ddp, fsdp, use_cuda, local_rank, with_ref):
    """--grad_ckpt; the reference (with_ref), which computes as the policy does (KL 0 at step 0): FSDP2 casts
    both to bf16, DDP and one process use fp32 weights under the same autocast (bf16 weights would keep a bf16
    residual stream beside the policy's fp32 one); then DDP (gradients reduced in place, no second copy; no
    buffers broadcast each forward) or FSDP2 (every decoder layer, then the root; the reference too: 7B, 15 GB
    in bf16). -> (model: what the forward runs, the DDP wrapper or the policy; ref or None)."""
    from transformers import AutoModelForCausalLM
    if cfg.grad_ckpt:
        policy.gradient_checkpointing_enable()
    model, ref = policy, None
    if with_ref:
        ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype if fsdp else torch.float32,
                                                   device_map=device)
        ref.eval().requires_grad_(False)
    if ddp and not fsdp:
        model = torch.nn.parallel.DistributedDataParallel(
            policy, device_ids=[local_rank] if use_cuda else None, gradient_as_bucket_view=True,
            broadcast_buffers=False)
    elif fsdp:
        fsdp2_shard(policy, ref, dtype)
    return model, ref


def fsdp2_shard(policy, ref, dtype):
    """FSDP2 (fully_shard): every decoder layer its own group, then the root (embedding, final norm, lm_head),
    for the policy and the reference alike; bf16 compute over fp32 shards, fp32 gradient reduction. The
    reference is resharded after its forward, root group included: it never runs a backward, which is where
    FSDP2 reshards a root that keeps its parameters unsharded after the forward (the default for a root,
    reshard_after_forward=None), so its embedding and lm_head (2 GB at 7B in bf16) would stay gathered for
    good."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for m, reshard_root in [(policy, None)] + ([(ref, True)] if ref is not None else []):
        for layer in m.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(m, mp_policy=mp, reshard_after_forward=reshard_root)


# ------------------------------------------------------------------------------------------------------------
# Per-rank memory by arithmetic (not measured): python -m plumbing.parallel memory
# ------------------------------------------------------------------------------------------------------------
QWEN = {"1.5B": dict(params=1.54e9, root=0.23e9, layers=28, hidden=1536, inter=8960, kv_heads=2, head_dim=128,
                     vocab=151936),
        "7B": dict(params=7.62e9, root=1.09e9, layers=28, hidden=3584, inter=18944, kv_heads=4, head_dim=128,
                   vocab=152064)}  # root: embedding (+ the untied lm_head of 7B); 1.5B ties them
GB = 2**30


def kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes=2):
    """vLLM's KV cache per token: K and V of every layer: layers x KV heads x head dim x 2 x bytes.
    Qwen2.5-1.5B (28, 2, 128) in bf16: 28,672 B (28 KB); 7B (28, 4, 128): 57,344 B (57 KB)."""
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def kv_cache_gb(model_path, seqs, max_model_len, dtype_bytes=2):
    """--vllm_kv_gb 0: the KV cache a rank's rollouts need, from the model's shape:
    kv_bytes_per_token (layers x KV heads x head dim x 2 x bytes; 28 KB a token at 1.5B, 57 KB at 7B)
    x seqs x max_model_len, GiB."""
    from transformers import AutoConfig
    c = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_token = kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, head_dim, dtype_bytes)
    return per_token * seqs * max_model_len / 2**30


def memory_gb(size, world=8, fsdp=False, seqs=18, seq_len=4608, micro_batch=8, resp_len=512, entropy=True,
              kl=True, graph_pool_gb=1.0, context_gb=1.0, frag=0.1):
    """Per-rank GiB of the GPU presets, as the code allocates it. -> {row: GiB}; "peak" = the resident rows +
    the largest of four phases that never coexist: the loss's forward (the reference scored while the policy's
    graph is alive), the backward through the loss head (the response logits), the backward through the layers
    (one recomputed at a time), the optimizer step; then allocator fragmentation on top. seqs: the most
    sequences a rank plays at once (train.py's `seqs`: max(|B| R / world = 16, the evaluation's ceil(140
    valid_seen games / 8) = 18)); seq_len: prompt budget + reply budget (4096 + 512); resp_len: the reply
    budget; entropy: the entropy term is on (the paper preset's entropy_coef 0.001); kl: a reference is scored
    (--kl_coef > 0). Three rows are allowances, not derived from the code: vLLM's CUDA-graph pool (vLLM prints
    it at start-up: "Graph capturing finished ... took N GiB"), the CUDA context (torch's and vLLM's kernels)
    with NCCL's buffers per process, and fragmentation: `frag` x the peak (the trainer and the in-process
    engine share one caching allocator and nothing calls empty_cache without --vllm_sleep)."""
    m = QWEN[size]
    P, shard = m["params"], (world if fsdp else 1)
    tok = micro_batch * seq_len  # tokens of one micro-batch, padded to its longest row
    layer = (P - m["root"]) / m["layers"]
    resp = micro_batch * resp_len * m["vocab"]  # response positions x vocab: the logits' elements
    rows = {
        "policy weights, fp32 master": 4 * P / shard,
        # DDP: views of its reduction buckets; FSDP2: sharded after the reduce
        "gradients, fp32": 4 * P / shard,
        "AdamW m and v, fp32": 8 * P / shard,
        # DDP: an fp32 reference under the policy's autocast, so both keep an fp32 residual stream (KL 0 at
        # step 0); FSDP2: bf16 shards, which FSDP2's mixed precision gives the policy too
        "reference weights": 0 if not kl else (2 * P / shard) if fsdp else 4 * P,
        "vLLM weights, bf16": 2 * P,
        "vLLM KV cache (parallel.kv_cache_gb)":
            seqs * seq_len * kv_bytes_per_token(m["layers"], m["kv_heads"], m["head_dim"]),
        "vLLM CUDA-graph pool (allowance)": graph_pool_gb * GB,
        "CUDA context + NCCL buffers (allowance)": context_gb * GB,
    }
    # FSDP2 all-gathers a group for its forward and backward: the root group (embedding, lm_head) stays
    if fsdp:
        # gathered from the policy's forward to its backward (root default), and one layer is gathered ahead
        rows["FSDP2: root group gathered, bf16"] = 2 * m["root"]
        rows["FSDP2: two layer groups gathered, bf16"] = 2 * 2 * layer
    # gradient checkpointing keeps each layer's input through the whole backward: the residual stream, fp32
    # under DDP (autocast computes in bf16 over fp32 weights, and the residual adds stay fp32), bf16 under
    # FSDP2's mixed precision (bf16 parameters)
    inputs = tok * m["hidden"] * (2 if fsdp else 4) * m["layers"]
    # the loss's forward (train.py update_policy, inside `with prec()`): autocast caches a bf16 copy of every
    # weight that requires grad until the region ends (DDP; FSDP2 casts itself, no autocast); the policy's
    # response logits wait for the backward (bf16 out of lm_head + the fp32 copy scaled by the temperature);
    # PolicyTerm's KL scores the reference then (MicroBatch.ref_lp): its bf16 logits, an fp32 copy and the
    # logsumexp temporary, ~10 B per token x vocab; FSDP2 gathers the reference's root and a layer for it
    fwd = {"forward, loss: checkpointed layer inputs": inputs,
           "forward, loss: policy response logits kept for the backward, 6 B per token x vocab": 6 * resp}
    if not fsdp:
        fwd["forward, loss: autocast's bf16 copies of the weights (cached for the region)"] = 2 * P
    if kl:
        fwd["forward, loss: reference forward on top, 10 B per token x vocab"] = 10 * resp
        if fsdp:
            fwd["forward, loss: reference root and a layer gathered, bf16"] = 2 * (m["root"] + layer)
    # the response positions' logits (grpo.response_logprobs, logits_to_keep): bf16 out of lm_head, one
    # fp32 copy scaled by the temperature; the backward of the log-probs holds it, its gradient, a recomputed
    # exp and the softmax's input gradient (~16 B per token x vocab); the entropy's backward
    # (grpo._EntropyOfLogits) two fp32 copies more, a recomputed log-softmax and its exp (~24 B)
    logit_bytes = 24 if entropy else 16
    head = {"backward, loss head: checkpointed layer inputs": inputs,
            f"backward, loss head: response logits, {logit_bytes} B per token x vocab": resp * logit_bytes}
    if not fsdp:  # lm_head is outside the checkpointed layers: its bf16 weight copy is saved for the backward
        head["backward, loss head: lm_head's bf16 copy, saved by autocast"] = 2 * m["root"]
    # the layer being recomputed holds its activations (~8 hidden-wide + 4 intermediate-wide tensors per
    # token, bf16) and as much again in grads
    layers = {"backward, layers: checkpointed layer inputs": inputs,
              "backward, layers: one layer recomputed, with its gradients":
                  tok * (8 * m["hidden"] + 4 * m["inter"]) * 2 * 2}
    if fsdp:  # the root group's gradients, unsharded in bf16 then cast to fp32 for the reduce-scatter
        layers["backward, layers: root group gradients before the reduce (bf16 + fp32)"] = (2 + 4) * m["root"]
    else:  # DDP's first backward: autograd's own .grad tensors exist beside the buckets until they are views
        layers["backward, layers, first step only: DDP grads before they are bucket views"] = 4 * P
    # torch AdamW (foreach, the CUDA default: torch/optim/adamw.py -> adam.py _multi_tensor_adam) builds
    # sqrt(v) / sqrt(bc2) + eps for every parameter of the group at once: one fp32 copy of the (local) params
    step = {"optimizer step: AdamW foreach temporaries (sqrt v)": 4 * P / shard}
    out = {k: v / GB for k, v in {**rows, **fwd, **head, **layers, **step}.items()}
    peak = (sum(rows.values()) + max(sum(p.values()) for p in (fwd, head, layers, step))) / GB
    out["peak (resident + the largest phase)"] = peak
    out["allocator fragmentation (allowance)"] = frag * peak
    out["peak with fragmentation"] = (1 + frag) * peak
    return out


def memory_table():
    cols = [memory_gb("1.5B"), memory_gb("7B", fsdp=True)]
    # resident rows, the backward's, the optimizer step's, the peak
    order = ("forward", "backward", "optimizer", ("peak", "allocator"))  # resident rows first, the phases
    phase = lambda k: next((j + 1 for j, p in enumerate(order) if k.startswith(p)), 0)  # noqa: E731
    # stable: each column's order
    keys = sorted(dict.fromkeys(k for c in cols for k in c), key=lambda k: phase(k))
    out = ["| per rank, GiB (8 ranks; worst case: micro-batches of 8 rows at the 4,096 + 512 token budget, "
           "18 sequences in vLLM) | Qwen2.5-1.5B, DDP | Qwen2.5-7B, FSDP2 |", "|---|---:|---:|"]
    out += [f"| {k} | " + " | ".join(f"{c[k]:.1f}" if k in c else "-" for c in cols) + " |" for k in keys]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["memory"]:
        print(memory_table())
    else:
        sys.exit("usage: python -m plumbing.parallel memory")


def same_on_ranks(consist, step):
    """consist: per rank (weight sum, run-state JSON) after a step. Ranks must agree (same batch, reduced
    gradients, scheduler update), else all stop with one line naming the first difference. -> consist."""
    import json
    w = [c[0] for c in consist]
    why = (f"weight sums {min(w)!r} .. {max(w)!r}" if max(w) - min(w) > 1e-6 * max(map(abs, w)) + 1e-12
           else next((f"rank {r}'s {p} differs from rank 0's" for r, c in enumerate(consist[1:], 1)
                      if (p := first_difference(json.loads(consist[0][1]), json.loads(c[1])))), None))
    if why:
        print(f"error: the ranks disagree after step {step}: {why}", file=sys.stderr)
        sys.exit(2)
    return consist


def first_difference(a, b, path="state"):
    """The path of the first field where two JSON values differ ("state.sched.A[1]"), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}"
            if p := first_difference(a[k], b[k], f"{path}.{k}"):
                return p
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        diffs = (first_difference(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
        return next((p for p in diffs if p), None)
    return None if a == b else path

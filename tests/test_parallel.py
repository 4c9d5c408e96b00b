"""The GPU path's setup on CPU: parallel.py's process group and precision, and rollout.py's vLLM engine arguments.
Fakes stand in for CUDA, torch.distributed and vllm.LLM; nothing here needs a GPU."""
import contextlib
import copy
import datetime
import os
import warnings

import pytest
import torch
import torch.distributed as dist

from plumbing import parallel
import rollout

VLLM_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL",
            "VLLM_USE_V2_MODEL_RUNNER")


# ---------------------------------------------------------------------------------------------------------------
# parallel.py: process group
# ---------------------------------------------------------------------------------------------------------------
def test_backend_gloo_and_nccl_on_cuda_gloo_alone_on_cpu():
    """One group with gloo for CPU tensors and NCCL for CUDA tensors on GPU; gloo alone on CPU."""
    assert parallel.backend(True) == "cpu:gloo,cuda:nccl"
    assert parallel.backend(False) == "gloo"


@pytest.fixture
def fake_dist(monkeypatch):
    """Record torch.cuda.set_device and dist.init_process_group calls, in order; rank 1 of 2."""
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append(("init_process_group", a, k)))
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    return calls


def _group_args(call):
    name, args, kw = call
    assert name == "init_process_group"
    return (args[0] if args else kw["backend"]), kw


def test_init_distributed_cuda_sets_the_device_before_the_group(fake_dist, monkeypatch):
    """Under torchrun on CUDA: set_device(LOCAL_RANK) first, then a gloo+nccl group bound to that device."""
    for k, v in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(k, v)
    assert parallel.init_distributed(True) == (True, 1, 2, 1, "cuda:1")
    assert [c[0] for c in fake_dist] == ["set_device", "init_process_group"]  # the order: device first
    assert fake_dist[0] == ("set_device", 1)
    backend, kw = _group_args(fake_dist[1])
    assert backend == "cpu:gloo,cuda:nccl"
    assert kw["device_id"] == torch.device("cuda", 1)
    assert kw["timeout"] >= datetime.timedelta(hours=1)  # one rank's rollouts can keep the others for minutes


def test_init_distributed_cpu_uses_gloo_and_no_device(fake_dist, monkeypatch):
    """Under torchrun on CPU: a gloo group without device_id, and no set_device."""
    for k, v in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(k, v)
    assert parallel.init_distributed(False) == (True, 1, 2, 1, "cpu")
    assert [c[0] for c in fake_dist] == ["init_process_group"]
    backend, kw = _group_args(fake_dist[0])
    assert backend == "gloo" and kw["device_id"] is None
    assert kw["timeout"] >= datetime.timedelta(hours=1)


def test_init_distributed_without_torchrun_makes_no_group(fake_dist, monkeypatch):
    """Without RANK in the env: one process, no process group; on CUDA it is cuda:0."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert parallel.init_distributed(False) == (False, 0, 1, 0, "cpu")
    assert fake_dist == []
    assert parallel.init_distributed(True) == (False, 0, 1, 0, "cuda:0")
    assert fake_dist == [("set_device", 0)]


# ---------------------------------------------------------------------------------------------------------------
# parallel.py: precision
# ---------------------------------------------------------------------------------------------------------------
def _tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).float()


def _one_step(model, ctx):
    """Forward under ctx, mean logit of token 0 as the loss, backward, one AdamW step at lr 1e-6.
    -> (parameters before, as clones)."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.tensor([[3, 17, 42, 5, 9, 60]])
    with ctx:
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        logits = model(input_ids=ids).logits
    logits.float()[..., 0].mean().backward()
    torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0).step()
    return before


def test_autocast_bf16_compute_over_fp32_master_weights():
    """bf16 autocast over fp32 weights: an lr 1e-6 step moves every norm weight; in bf16 weights it rounds away."""
    assert isinstance(parallel.autocast("cpu", torch.float32), contextlib.nullcontext)  # fp32: a no-op
    with warnings.catch_warnings():  # a CPU-only torch warns that CUDA autocast is unavailable
        warnings.simplefilter("ignore")
        assert parallel.autocast("cuda:1", torch.bfloat16).device == "cuda"  # the device type, not the index
    model = _tiny_qwen2()
    ref = copy.deepcopy(model)
    before = _one_step(model, parallel.autocast("cpu", torch.bfloat16))
    norms = [n for n, _ in model.named_parameters() if n.endswith("norm.weight")]
    assert len(norms) == 5  # 2 layers x (input, post-attention) + the final norm, all initialised at 1.0
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32, n  # the master weights stay fp32
        if p.grad is not None:
            assert (p.detach() != before[n]).any(), n
    for n in norms:
        # fp32 spacing just below 1.0 is 2^-24 = 6e-8, so 1 -+ 1e-6 is representable: every element moves
        assert (before[n] == 1.0).all() and (model.get_parameter(n).detach() != 1.0).all(), n
    # the same step with the weights themselves in bf16: spacing at 1.0 is 2^-7 = 0.0078 (2^-8 just below),
    # so 1 -+ 1e-6 rounds back to 1.0 and the norm weights do not move
    ref = ref.to(torch.bfloat16)
    _one_step(ref, parallel.autocast("cpu", torch.bfloat16))
    for n in norms:
        assert ref.get_parameter(n).grad is not None and (ref.get_parameter(n).detach() == 1.0).all(), n


# ---------------------------------------------------------------------------------------------------------------
# rollout.py: vLLM engine arguments
# ---------------------------------------------------------------------------------------------------------------
def _kwargs(constrained=False, cuda=False, kv_gb=0.0, sleep=False, distributed=False, gpu_mem=0.4):
    return rollout.engine_kwargs("/m", "bfloat16", 7, 2048, gpu_mem, kv_gb, sleep, constrained, cuda, distributed)


def test_engine_kwargs_unconstrained_has_no_logits_processor():
    """constrained=False: no logits_processors (vLLM's V2 CUDA runner rejects ours) and no env to set."""
    kw, env = _kwargs(constrained=False, cuda=True)
    assert "logits_processors" not in kw and env == {}
    assert kw["model"] == "/m" and kw["dtype"] == "bfloat16" and kw["seed"] == 7 and kw["max_model_len"] == 2048


def test_engine_kwargs_constrained_adds_the_trie_mask_and_the_v1_runner():
    """constrained=True: the trie-mask logits processor, and VLLM_USE_V2_MODEL_RUNNER=0 for it."""
    pytest.importorskip("vllm")
    kw, env = _kwargs(constrained=True, cuda=True)
    assert len(kw["logits_processors"]) == 1 and kw["logits_processors"][0].__name__ == "TrieMask"
    assert env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_engine_kwargs_cuda_memory_sleep_and_launcher():
    """cuda: gpu_memory_utilization, kv_gb GiB of KV cache, sleep mode; CPU: eager, none of those."""
    kw, _ = _kwargs(cuda=True, kv_gb=2.0, sleep=True, gpu_mem=0.4)
    assert kw["kv_cache_memory_bytes"] == 2 * 2**30 and kw["gpu_memory_utilization"] == 0.4  # 2 GiB = 2147483648
    assert kw["enable_sleep_mode"] is True and kw["enforce_eager"] is False
    kw, _ = _kwargs(cuda=True, kv_gb=0.0)  # kv_gb 0: the engine takes its share of the card instead
    assert "kv_cache_memory_bytes" not in kw and kw["gpu_memory_utilization"] == 0.4
    kw, _ = _kwargs(cuda=False, kv_gb=2.0, sleep=True)
    assert "kv_cache_memory_bytes" not in kw and "gpu_memory_utilization" not in kw
    assert kw["enforce_eager"] is True and kw["enable_sleep_mode"] is False  # sleep mode only with CUDA
    assert "distributed_executor_backend" not in kw
    kw, _ = _kwargs(distributed=True)
    assert kw["distributed_executor_backend"] == "external_launcher" and kw["tensor_parallel_size"] == 1


def test_vllm_block_reaches_the_engine_and_a_bad_one_fails(capsys):
    """--vllm_block: vLLM's block_size when > 0 (the CPU presets' 64), vLLM's own default at 0 (the GPU
    presets); a size the CPU kernel cannot take is a one-line error at start-up."""
    from config import get_config
    kw, _ = rollout.engine_kwargs("/m", "float32", 7, 2048, 0.5, 0.0, False, False, False, False, block=64)
    assert kw["block_size"] == 64 and "block_size" not in _kwargs()[0]
    assert [get_config(["--preset", p]).vllm_block for p in ("cpu", "cpu_pick2", "cpu_mix6", "paper")] == \
        [64, 64, 64, 0]
    with pytest.raises(SystemExit):
        get_config(["--vllm_block", "48"])
    assert "--vllm_block must be 0 (vLLM's default) or a multiple of 32" in capsys.readouterr().err


class _FakeLLM:
    """Stands in for vllm.LLM: records the keyword arguments it was built with."""
    built = []

    def __init__(self, **kw):
        _FakeLLM.built.append(kw)


@pytest.fixture
def fake_llm(monkeypatch):
    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(vllm, "LLM", _FakeLLM, raising=False)  # raising=False: no import of the real one
    for k in VLLM_ENV:  # setenv then delenv: monkeypatch restores the original (set or unset) afterwards
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)
    _FakeLLM.built = []
    return _FakeLLM.built


def test_vllm_engine_passes_a_logits_processor_only_when_constrained(fake_llm, monkeypatch):
    """VLLMEngine(constrained=False) builds vllm.LLM without logits_processors; constrained=True with it + V1."""
    rollout.VLLMEngine("/m", tok=object(), constrained=False)
    assert len(fake_llm) == 1 and "logits_processors" not in fake_llm[0]
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # even when the user asked for V2
    eng = rollout.VLLMEngine("/m", tok=object(), constrained=True)
    assert len(fake_llm) == 2 and len(fake_llm[1]["logits_processors"]) == 1
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert eng.constrained is True and eng.sleep is False  # no sleep mode without CUDA


class _Out:  # one vllm RequestOutput as VLLMEngine.generate reads it
    def __init__(self, ids):
        lp = type("Logprob", (), {"logprob": -0.5})()
        self.outputs = [type("Completion", (), {"token_ids": ids, "logprobs": [{t: lp} for t in ids],
                                                "finish_reason": "stop"})()]


class _RecordingLLM(_FakeLLM):
    """_FakeLLM that also answers generate (recording the SamplingParams) and sleep / wake_up."""
    calls = []

    def generate(self, prompts, params, use_tqdm=False):
        _RecordingLLM.calls.append(("generate", params))
        return [_Out([5, 6]) for _ in prompts]

    def sleep(self, level):
        _RecordingLLM.calls.append(("sleep", level))

    def wake_up(self):
        _RecordingLLM.calls.append(("wake_up",))


@pytest.fixture
def recording_llm(fake_llm, monkeypatch):
    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(vllm, "LLM", _RecordingLLM, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the CUDA path: per-request seeds, sleep mode
    _RecordingLLM.calls = []
    return _RecordingLLM.calls


def test_request_seeds_stay_inside_int64_for_a_large_run_seed(recording_llm):
    """--seed 10**6: train.py's rollout seed (seed * 1_000_003 + step * 1009 + rank), times 1000 per turn, times
    100003 per request passes 2^63 (vLLM V2 keeps request seeds in an int64 array). Every seed is reduced into
    [0, 2^63): seed63(2^63 + 5) = 5 by hand, and the requests of one call keep distinct seeds."""
    eng = rollout.VLLMEngine("/m", tok=object(), constrained=False)
    turn_seed = (10**6 * 1_000_003 + 3 * 1009 + 1) * 1000 + 4  # --seed 10**6, step 3, rank 1, turn 4
    assert turn_seed * 100003 > 2**63  # what vLLM would be handed without the reduction
    eng.generate([[1, 2], [3], [4]], 8, 1.0, seed=turn_seed)
    seeds = [p.seed for p in recording_llm[-1][1]]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == 3
    assert rollout.seed63(2**63 + 5) == 5 and rollout.seed63(7) == 7 and rollout.seed63(2**64) == 0


def test_vllm_sleep_drops_the_weights_instead_of_copying_them_to_the_host(recording_llm):
    """--vllm_sleep 1: level 2 (weights and KV cache dropped; the sync rewrites every weight after wake_up), not
    level 1 (a host copy of the weights every step, 14 GB a rank at 7B)."""
    eng = rollout.VLLMEngine("/m", tok=object(), constrained=False, sleep=True)
    assert eng.sleep is True
    eng.sleep_mode(True)
    eng.sleep_mode(False)
    assert recording_llm == [("sleep", 2), ("wake_up",)]


def test_kv_cache_is_sized_from_the_model(tmp_path):
    """KV bytes per token = layers x KV heads x head dim x 2 (K, V) x 2 B (bf16): Qwen2.5-1.5B (28, 2, 128) 28,672;
    7B (28, 4, 128) 57,344. kv_cache_gb reads the shape from config.json: the tiny model (4 layers, 2 KV heads,
    head dim 128 / 4 = 32) holds 4 * 2 * 32 * 2 * 2 = 1,024 B a token; 16 sequences of 2,048 tokens: 32 MiB."""
    from plumbing.parallel import kv_bytes_per_token
    from plumbing.tiny import tiny_path
    assert kv_bytes_per_token(28, 2, 128) == 28_672 and kv_bytes_per_token(28, 4, 128) == 57_344
    assert parallel.kv_cache_gb(tiny_path(str(tmp_path)), 16, 2048) == pytest.approx(32 / 1024)


def test_fsdp2_reference_is_resharded_after_its_forward(tmp_path):
    """parallel.fsdp2_shard on a one-rank gloo group: after a forward, the reference's root group (embedding,
    lm_head) is back to its shards (it never runs the backward that would reshard it), while the policy's root
    keeps its gathered parameters until its backward (FSDP2's default for a root)."""
    import socket
    import subprocess
    import sys
    from plumbing.tiny import tiny_path
    path = tiny_path(str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f"""
import os, torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM
from plumbing.parallel import fsdp2_shard
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
policy = AutoModelForCausalLM.from_pretrained({str(path)!r}, dtype=torch.float32)
ref = AutoModelForCausalLM.from_pretrained({str(path)!r}, dtype=torch.float32).eval().requires_grad_(False)
fsdp2_shard(policy, ref, torch.float32)
x = torch.tensor([[5, 6, 7]])
with torch.no_grad():
    ref(input_ids=x)
policy(input_ids=x)
print("SHARDED", isinstance(ref.model.embed_tokens.weight, DTensor), isinstance(policy.model.embed_tokens.weight, DTensor))
dist.destroy_process_group()
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert "SHARDED True False" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


def test_the_engine_follows_the_prompt_budget_and_sizes_its_cache(recording_llm, tmp_path):
    """--preset paper: max_model_len = 4,096 prompt + 512 reply tokens; --vllm_kv_gb 0 sizes the KV cache from the
    model: the tiny model's 1,024 B a token x 16 sequences x 4,608 tokens = 75,497,472 B."""
    from config import get_config
    from plumbing.tiny import tiny_path
    path = tiny_path(str(tmp_path))
    cfg = get_config(["--preset", "paper"])
    rollout.make_engine(cfg, path, object(), "cuda", 0, seqs=16)
    kw = _FakeLLM.built[-1]
    assert kw["max_model_len"] == 4096 + 512 and kw["kv_cache_memory_bytes"] == 16 * 4608 * 1024
    with pytest.raises(SystemExit, match="exceeds .* context of 8192 tokens"):
        rollout.make_engine(get_config(["--preset", "paper", "--max_prompt_tokens", "8000"]), path, object(), "cuda", 0)


def test_gpu_presets_follow_the_authors_launchers():
    """Values read off examples/gmsv_trainer/run_alfworld.sh and run_webshop.sh (commit e065918): env.max_steps=20
    (ALFWorld) and 15 (WebShop), data.max_prompt_length=4096, val_kwargs temperature 0.4 and do_sample, test_freq=5,
    val_data_size=128; valid_seen is verl-agent's eval_in_distribution; the action projection's rules."""
    from config import get_config
    for name in ("paper", "released"):
        c = get_config(["--preset", name])
        assert (c.max_steps, c.max_prompt_tokens, c.max_new_tokens) == (20, 4096, 512)
        assert (c.eval_protocol, c.eval_split, c.eval_temperature, c.authors_every, c.authors_episodes, c.eval_every) \
            == ("both", "valid_seen,valid_unseen", 0.4, 5, 128, 50)
        assert (c.parse_lower, c.parse_think, c.webshop_setting, c.webshop_split) == (True, True, "authors", "authors")
    w = get_config(["--preset", "released_webshop"])
    assert (w.max_steps, w.eval_split, w.env) == (15, "eval", "webshop")
    cpu = get_config(["--preset", "cpu_pick2"])  # the CPU presets keep theirs
    assert (cpu.parse_lower, cpu.parse_think, cpu.eval_protocol, cpu.eval_temperature, cpu.max_prompt_tokens) == \
        (False, False, "panel", 1.0, 768)


def test_ranks_that_disagree_stop_in_one_line(capsys):
    """same_on_ranks: equal weight sums and run states pass through; a scheduler statistic that differs on rank 1
    names its path (state.sched.A[1]), a weight sum that differs names the sums; exit code 2, one line."""
    import json
    from plumbing.parallel import first_difference, same_on_ranks
    state = {"sched": {"A": [0.1, 0.2], "mu_global": 0.6}, "hints": {}}
    other = {"sched": {"A": [0.1, 0.25], "mu_global": 0.6}, "hints": {}}
    same = [(12.5, json.dumps(state)), (12.5, json.dumps(state))]
    assert same_on_ranks(same, 3) is same
    assert first_difference(state, other) == "state.sched.A[1]"
    assert first_difference(state, {**state, "extra": 1}) == "state.extra"
    for consist, words in (([(12.5, json.dumps(state)), (12.5, json.dumps(other))], "rank 1's state.sched.A[1]"),
                           ([(12.5, json.dumps(state)), (12.6, json.dumps(state))], "weight sums 12.5 .. 12.6")):
        with pytest.raises(SystemExit) as e:
            same_on_ranks(consist, 3)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: the ranks disagree after step 3: ")
        assert words in err[0], err[0]


def test_memory_rows_are_the_formula_by_hand():
    """plumbing.parallel.memory_gb at Qwen2.5-1.5B under DDP, by hand (GiB = 2^30 B): checkpointed layer inputs
    8 x 4,608 tokens x 1,536 x 4 B (fp32 residual under autocast) x 28 layers = 6,341,787,648 B = 5.906; response
    logits with the entropy 8 x 512 x 151,936 x 24 B = 14,935,916,544 B = 13.910 (16 B without: 9.273); KV cache
    18 sequences x 4,608 x 28,672 B = 2,378,170,368 B = 2.215. The loss's forward: the inputs, the policy's logits
    kept for the backward 6 x 622,329,856 = 3,733,979,136 B, autocast's bf16 weight copies 2 x 1.54e9 =
    3,080,000,000 B (2.868), the reference's forward 10 x 622,329,856 = 6,223,298,560 B (5.796): 19,379,065,344 B
    = 18.048. The loss head's phase is 5.906 + 13.910 + lm_head's saved bf16 copy (2 x 0.23e9 B = 0.428) = 20.245,
    the layers' 5.906 + 6.6 (one layer: 36,864 x (8 x 1,536 + 4 x 8,960) x 4 B = 7,096,762,368 B = 6.609) + 5.737
    (DDP's first-step grads, 4 x 1.54e9 B) = 18.252, the optimizer's 5.737: the peak adds the loss head's alone to
    the resident rows, not every phase; fragmentation is 10 % of that peak on top."""
    from plumbing.parallel import GB, memory_gb
    m = memory_gb("1.5B")
    assert m["backward, loss head: checkpointed layer inputs"] == pytest.approx(6_341_787_648 / GB)
    assert m["backward, loss head: response logits, 24 B per token x vocab"] == pytest.approx(14_935_916_544 / GB)
    assert memory_gb("1.5B", entropy=False)["backward, loss head: response logits, 16 B per token x vocab"] == \
        pytest.approx(8 * 512 * 151_936 * 16 / GB)
    assert m["vLLM KV cache (parallel.kv_cache_gb)"] == pytest.approx(2_378_170_368 / GB)
    assert m["backward, layers: one layer recomputed, with its gradients"] == pytest.approx(7_096_762_368 / GB)
    forward = [v for k, v in m.items() if k.startswith("forward")]
    assert sum(forward) == pytest.approx(19_379_065_344 / GB) and len(forward) == 4
    assert m["forward, loss: autocast's bf16 copies of the weights (cached for the region)"] == \
        pytest.approx(3_080_000_000 / GB)
    assert m["forward, loss: reference forward on top, 10 B per token x vocab"] == pytest.approx(6_223_298_560 / GB)
    resident = sum(v for k, v in m.items() if not k.startswith(("forward", "backward", "optimizer", "peak", "alloc")))
    head = (6_341_787_648 + 14_935_916_544 + 460_000_000) / GB
    assert m["peak (resident + the largest phase)"] == pytest.approx(resident + head)
    assert m["peak with fragmentation"] == pytest.approx(1.1 * (resident + head))
    assert "forward, loss: reference forward on top, 10 B per token x vocab" not in memory_gb("1.5B", kl=False)
    assert memory_gb("7B", fsdp=True)["backward, loss head: checkpointed layer inputs"] == \
        pytest.approx(8 * 4608 * 3584 * 2 * 28 / GB)  # bf16 under FSDP2's mixed precision

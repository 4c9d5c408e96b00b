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

import parallel
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

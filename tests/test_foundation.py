"""Foundation: the flat config CLI, and the offline tiny model through transformers."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_lists_every_flag():
    from config import Config
    import dataclasses
    r = run("train.py", "--help")
    assert r.returncode == 0
    for f in dataclasses.fields(Config):
        assert f"--{f.name}" in r.stdout


@pytest.mark.parametrize("args,msg", [
    (["--preset", "nonsense"], "unknown preset 'nonsense'"),
    (["--scheduler", "oracle"], "unknown scheduler 'oracle'"),  # a file's rule (module:Class) is allowed too
    (["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag"),
    (["--group_size", "x"], "invalid int value"),
    (["--fixed_ratio", "1.5"], "--fixed_ratio"),
    (["--group_size", "1"], "--group_size 1: GRPO needs at least 2 rollouts per task"),  # every advantage would be 0
])
def test_bad_config_fails_clearly(args, msg):
    r = run("train.py", *args)
    assert r.returncode == 2
    assert msg in r.stderr
    assert "Traceback" not in r.stderr


def test_presets_load_and_override():
    from config import get_config
    c = get_config(["--preset", "paper"])
    assert (c.model, c.lr, c.steps, c.lam, c.cap, c.K) == ("Qwen/Qwen2.5-1.5B-Instruct", 1e-5, 200, 1.0, 1.0, 3)
    r = get_config(["--preset", "released", "--steps", "7"])
    assert (r.lam, r.cap, r.K, r.cluster_mode, r.mu_update, r.stats_level, r.prefix_unit, r.steps) == \
        (0.3, 0.8, 5, "balanced", "deadband", "traj", "token", 7)
    assert (r.reward_scale, r.invalid_penalty) == (10.0, 0.1)  # docs/method.md §2.1: 10 x won, 0.1 per invalid action
    assert get_config([]).preset == "cpu"


def test_every_preset_loads_and_the_cpu_variants_inherit_cpu():
    import os

    from config import PRESET_DIR, get_config
    for f in sorted(os.listdir(PRESET_DIR)):
        if f.endswith(".py"):
            assert get_config(["--preset", f[:-3]]).preset == f[:-3]
    cpu, ws, p2 = (get_config(["--preset", p]) for p in ("cpu", "cpu_webshop", "cpu_pick2"))
    assert (ws.env, ws.model, ws.max_new_tokens, ws.eval_games, ws.task_types) == \
        ("webshop", "checkpoints/sft_webshop", 64, 100, "")
    assert (p2.task_types, p2.group_size, p2.batch_tasks, p2.lr, p2.steps) == ("pick_two_obj_and_place", 4, 16, 1e-4, 150)
    for c in (ws, p2):  # what they do not set comes from cpu.py
        assert (c.constrained, c.prompt, c.loss_agg, c.eta, c.kl_coef) == (cpu.constrained, cpu.prompt, cpu.loss_agg,
                                                                           cpu.eta, cpu.kl_coef) == (True, "compact",
                                                                                                     "episode", 0.5, 0.0)


def test_unknown_subcommands_fail_clearly():
    for script, msg in ((["eval.py", "--diagnostic"], "unknown subcommand"), (["-m", "tools.bench", "nonsense"], "invalid choice")):
        r = run(*script)
        assert r.returncode != 0 and msg in r.stdout + r.stderr
    r = subprocess.run(["bash", "run_all.sh", "--no-such-option"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown option" in r.stderr


def test_tiny_model_loads_and_chat_template_roundtrips(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from rollout import parse_action
    from plumbing.tiny import build, tiny_path
    path = tiny_path(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.hidden_size // model.config.num_attention_heads >= 32  # vLLM CPU needs head_dim >= 32
    assert model.config.vocab_size == len(tok)
    msgs = [{"role": "user", "content": "task: put a mug in the coffeemachine."},
            {"role": "assistant", "content": "<action>take mug 1 from countertop 2</action>"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    back = tok.decode(ids)
    assert back == text
    reply = back.split("<|im_start|>assistant\n")[1]
    assert parse_action(reply) == "take mug 1 from countertop 2"
    for t in ("<action>", "</action>", "<think>", "</think>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1
    with torch.no_grad():
        out = model(torch.tensor([ids])).logits
    assert out.shape == (1, len(ids), len(tok)) and torch.isfinite(out).all()
    # deterministic: the same seed gives the same files
    other = build(str(tmp_path / "again"), seed=0)
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert open(os.path.join(path, f), "rb").read() == open(os.path.join(other, f), "rb").read(), f

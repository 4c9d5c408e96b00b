"""ckpt.py on a tiny random Qwen2: the directory loads back in transformers with the same weights (tied head
included), the optimizer/RNG/scheduler state round-trips, only complete checkpoints are found, old ones are
pruned, a crashed process's log tail is trimmed on resume, and --resume without a checkpoint exits with a one-line
error. train.py's resume run is in test_train."""
import os
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen2Config

from plumbing import ckpt
from config import dump, get_config


class Tok:  # the tokenizer's only role here: write its files next to the weights
    def save_pretrained(self, path):
        open(os.path.join(path, "tokenizer.json"), "w").write("{}")


def tiny(tie):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=tie))


@pytest.mark.parametrize("tie", [True, False])
def test_save_load_round_trip(tmp_path, tie):
    cfg = get_config([])
    m = tiny(tie)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    random.seed(5)
    rng = ckpt.rng_state()
    state = {"step": 3, "reason": "periodic", "sched": {"mu_global": 0.7}, "redraws": 1}
    path = ckpt.save(str(tmp_path), 3, m, Tok(), m.state_dict(), {"opt": opt.state_dict(), "rng": [rng]}, state,
                     cfg, keep=2)
    assert sorted(os.listdir(path)) == sorted(["COMPLETE", "config.json", "config.json.run", "generation_config.json",
                                               "model.safetensors", "state.json", "tokenizer.json", "trainer.pt"])
    assert ("lm_head.weight" in load_file(os.path.join(path, "model.safetensors"))) != tie  # the tied copy is dropped
    back = AutoModelForCausalLM.from_pretrained(path)  # a plain HF checkpoint
    for k, v in m.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    p2, sd, tr, st = ckpt.load("auto", str(tmp_path), tie)
    assert p2 == path and st == state
    fresh = tiny(tie)
    fresh.load_state_dict(sd)  # strict: the tied lm_head is restored when save_pretrained dropped it
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in m.state_dict().items())
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    opt2.load_state_dict(tr["opt"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    ckpt.set_rng_state(rng)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    ckpt.set_rng_state(tr["rng"][0])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_latest_skips_incomplete_and_prunes(tmp_path):
    cfg = get_config([])
    m = tiny(True)
    for step in (1, 2, 3):
        ckpt.save(str(tmp_path), step, m, Tok(), m.state_dict(), {}, {"step": step}, cfg, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000002", "ckpt_000003"]
    os.makedirs(tmp_path / "ckpt_000004.tmp")  # a save that crashed before the rename
    open(tmp_path / "ckpt_000004.tmp" / "COMPLETE", "w").write("periodic")
    os.makedirs(tmp_path / "ckpt_000005")  # no COMPLETE
    assert ckpt.complete(str(tmp_path)) == [str(tmp_path / "ckpt_000002"), str(tmp_path / "ckpt_000003")]
    assert ckpt.latest(str(tmp_path)) == str(tmp_path / "ckpt_000003")
    ckpt.save(str(tmp_path), 6, m, Tok(), m.state_dict(), {}, {"step": 6}, cfg, keep=2)
    # keep=2 counts complete checkpoints only: the COMPLETE-less ckpt_000005 must not push out ckpt_000003
    assert ckpt.complete(str(tmp_path)) == [str(tmp_path / "ckpt_000003"), str(tmp_path / "ckpt_000006")]
    all_kept = tmp_path / "all"
    for step in (1, 2, 3):
        ckpt.save(str(all_kept), step, m, Tok(), m.state_dict(), {}, {"step": step}, cfg, keep=0)
    assert sorted(os.listdir(all_kept)) == ["ckpt_000001", "ckpt_000002", "ckpt_000003"]


def test_non_finite_weights_are_never_written(tmp_path):
    """A diverged model is refused whatever asks to save it: no ckpt_<step> and no .tmp left, the older
    checkpoints kept (pruning never runs)."""
    cfg = get_config([])
    m = tiny(True)
    ckpt.save(str(tmp_path), 1, m, Tok(), m.state_dict(), {}, {"step": 1}, cfg, keep=1)
    with torch.no_grad():
        next(m.parameters()).view(-1)[3] = float("inf")
    with pytest.raises(ValueError, match="checkpoint at step 2 not written: non-finite values in"):
        ckpt.save(str(tmp_path), 2, m, Tok(), m.state_dict(), {}, {"step": 2}, cfg, keep=1)
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000001"]


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no complete checkpoint"):
        ckpt.load("auto", str(tmp_path), True)
    with pytest.raises(SystemExit, match="no complete checkpoint"):
        ckpt.load(str(tmp_path / "nope"), str(tmp_path), True)
    os.makedirs(tmp_path / "ckpt_000001")  # an explicit directory without COMPLETE
    with pytest.raises(SystemExit, match="no complete checkpoint"):
        ckpt.load(str(tmp_path / "ckpt_000001"), str(tmp_path), True)


def test_trim_log_drops_what_a_crash_logged_past_the_checkpoint(tmp_path):
    # A process checkpointed at step 4 (after its step-4 eval), logged steps 4 and 5 and an eval at 6, then crashed.
    # Resuming at step 4 must leave steps 0..3 and the evals at 0 and 4, once each, in order.
    import json
    log = tmp_path / "log.jsonl"
    recs = [{"step": 0, "eval": {}}] + [{"step": s} for s in range(4)] + [{"step": 4, "eval": {}}] \
        + [{"step": 4}, {"step": 5}, {"step": 6, "eval": {}}]
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    ckpt.trim_log(str(log), 4)
    assert [json.loads(x) for x in log.read_text().splitlines()] == recs[:6]
    # The run's last checkpoint (step 4 of 4) comes before its final eval, which the resumed run writes again.
    ckpt.trim_log(str(log), 4, final=True)
    assert [json.loads(x) for x in log.read_text().splitlines()] == recs[:5]
    ckpt.trim_log(str(tmp_path / "missing.jsonl"), 4)  # a fresh out_dir: nothing to trim, no error


def test_changed_flags_names_what_a_resume_changes(tmp_path):
    cfg = get_config(["--preset", "cpu", "--lr", "1e-4", "--steps", "10"])
    os.makedirs(tmp_path / "ckpt_000005")
    assert ckpt.changed_flags(str(tmp_path / "ckpt_000005"), cfg) == []  # an old checkpoint without the file
    dump(cfg, str(tmp_path / "ckpt_000005" / "config.json.run"))
    # more steps and another worker count continue the same experiment; a new lr or scheduler does not
    same = get_config(["--preset", "cpu", "--lr", "1e-4", "--steps", "20", "--num_workers", "1"])
    assert ckpt.changed_flags(str(tmp_path / "ckpt_000005"), same) == []
    other = get_config(["--preset", "cpu", "--lr", "5e-4", "--steps", "10", "--scheduler", "none"])
    assert ckpt.changed_flags(str(tmp_path / "ckpt_000005"), other) == ["lr: 0.0001 -> 0.0005",
                                                                      "scheduler: 'g2' -> 'none'"]


def test_a_first_signal_asks_for_a_stop_and_a_second_aborts():
    """plumbing/ckpt.catch_signals: the first SIGTERM only sets stop_requested() (train.py stops after the step,
    with a checkpoint); a second one raises KeyboardInterrupt at once."""
    import signal
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        ckpt.catch_signals(0)
        assert not ckpt.stop_requested()
        os.kill(os.getpid(), signal.SIGTERM)
        assert ckpt.stop_requested()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        ckpt.catch_signals(0)  # a new run in this process starts unstopped
        assert not ckpt.stop_requested()
    finally:
        for s, h in saved.items():
            signal.signal(s, h)

"""A newcomer's mistakes end in one line that names the path and the fix, exit code 2, no traceback; a run
directory that holds a run is never overwritten silently; pruning never deletes the checkpoint just
written."""
import json
import os
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*cmd, env=None, timeout=300):
    e = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
    p = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env={**e, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", **(env or {})})
    return p.returncode, p.stderr.strip().splitlines()


def one_line(rc, err, *words):
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), (rc, err[-5:])
    assert all(w in err[0] for w in words), err[0]


@pytest.mark.parametrize("script", [["train.py"], ["eval.py", "panel"], ["envs.py", "stats"]])
def test_missing_official_data(script):
    one_line(*run(*script, "--games", "official"), "ALFWORLD_DATA is unset", "--games builtin")


@pytest.mark.parametrize("script", [["train.py"], ["eval.py", "panel"]])
def test_missing_model_directory(script):
    one_line(*run(*script, "--model", "/no/such/dir"), "no checkpoint at /no/such/dir", "'tiny'")


@pytest.mark.parametrize("script", [["train.py"], ["eval.py", "panel"]])
def test_malformed_model_directory(script, tmp_path):
    (tmp_path / "weights.bin").write_text("")
    one_line(*run(*script, "--model", str(tmp_path)), f"--model {tmp_path}: no config.json")


def test_unreachable_hub_id(tmp_path):
    rc, err = run("train.py", "--model", "nosuchorg/nosuchmodel", "--out_dir", str(tmp_path / "o"), "--steps",
                  "1", "--eval_games", "-1", "--num_workers", "1", "--engine", "hf")
    one_line(rc, err, "--model nosuchorg/nosuchmodel: not a local directory and not loadable", "download it")


@pytest.mark.parametrize("script", [["train.py"], ["eval.py", "panel"]])
@pytest.mark.parametrize("args, words", [
    (["--expert_data", "/no/such/expert.json"], ["--expert_data /no/such/expert.json: no such file",
                                                  "empty"]),
    (["--eval_split", "valid_seen,bogus"], ["--eval_split valid_seen,bogus: no split 'bogus'",
                                            "have: train, valid_seen, valid_unseen"]),
    (["--env", "webshop", "--eval_split", "valid"], ["no split 'valid' in --env webshop", "eval", "test"]),
    (["--eval_temperature", "-1"], ["--eval_temperature -1", "[0, inf)"]),
    (["--env", "bogus"], ["--env 'bogus': no such environment", "alfworld", "webshop", "module:Class"]),
    (["--env", "no_such_module_xyz:Env"], ["cannot import 'no_such_module_xyz'", "PYTHONPATH"]),
])
def test_bad_inputs_fail_at_start_up_in_one_line(script, args, words):
    """A missing expert file, a split the environment does not have, a negative temperature, an environment
    that is not registered: one line before any engine starts, never a traceback or a fall-back to
    ALFWorld."""
    one_line(*run(*script, *args), *words)


def test_run_directory_is_never_overwritten_silently(tmp_path):
    d = tmp_path / "run"
    (d / "ckpt_000040").mkdir(parents=True)
    (d / "ckpt_000040" / "COMPLETE").write_text("")
    (d / "log.jsonl").write_text('{"step": 0}\n' * 43)
    rc, err = run("train.py", "--out_dir", str(d), "--steps", "1")
    one_line(rc, err, f"--out_dir {d} already holds a run", "--resume auto", "new --out_dir", "--overwrite 1")
    assert len(open(d / "log.jsonl").readlines()) == 43 and (d / "ckpt_000040").is_dir()  # untouched
    from config import Config, check_out_dir
    check_out_dir(Config(out_dir=str(d), overwrite=True))  # --overwrite 1: the old run's files go first
    assert sorted(os.listdir(d)) == []
    check_out_dir(Config(out_dir=str(d)))  # an empty directory, or --resume: no complaint
    (d / "log.jsonl").write_text("{}\n")
    check_out_dir(Config(out_dir=str(d), resume="auto"))


def test_a_first_run_that_failed_is_not_offered_a_resume(tmp_path):
    """A run that failed before its first checkpoint leaves log.jsonl (its first evaluation) and no complete
    checkpoint (a ckpt_*.tmp of a crash mid-save is none): the rerun's one line offers a new --out_dir or
    --overwrite 1, and says there is no checkpoint to resume, never --resume auto."""
    d = tmp_path / "run"
    (d / "ckpt_000005").mkdir(parents=True)  # no COMPLETE: not a checkpoint
    (d / "log.jsonl").write_text('{"step": 0, "eval": {}}\n')
    rc, err = run("train.py", "--out_dir", str(d), "--steps", "1")
    one_line(rc, err, f"--out_dir {d} already holds a run", "no checkpoint to resume", "new --out_dir",
             "--overwrite 1")
    assert "--resume" not in err


def test_pruning_keeps_the_checkpoint_just_written(tmp_path):
    """An old run's ckpt_000020 and ckpt_000040 sort after the new step 1: with keep 2 the new ckpt_000001 and
    the newest old one (ckpt_000040) stay, ckpt_000020 goes."""
    from plumbing import ckpt
    for s in (20, 40):
        (tmp_path / f"ckpt_{s:06d}").mkdir()
        (tmp_path / f"ckpt_{s:06d}" / "COMPLETE").write_text("")
    def save(p, **kw):
        os.makedirs(p, exist_ok=True)
        open(os.path.join(p, "w"), "w").close()
    stub = types.SimpleNamespace(save_pretrained=save)
    from config import Config
    path = ckpt.save(str(tmp_path), 1, stub, stub, None, {}, {"step": 1}, Config(), keep=2)
    assert path == str(tmp_path / "ckpt_000001")
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000001", "ckpt_000040"]
    assert json.load(open(tmp_path / "ckpt_000001" / "state.json")) == {"step": 1}
    ckpt.save(str(tmp_path), 2, stub, stub, None, {}, {"step": 2}, Config(), keep=1)
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000002"]


@pytest.mark.parametrize("args, words", [
    (["--lr", "-1"], ["--lr -1: out of range, expected a value in (0, 1]"]),
    (["--eta", "nan"], ["--eta nan: expected a number"]),
    (["--train_games", "-5"], ["--train_games -5: out of range, expected a value in [0, inf)"]),
    (["--overlap", "1", "--sample_streams", "engine"], ["--overlap 1 needs --sample_streams episode"]),
])
def test_bad_numbers_fail_at_start_up_in_one_line(args, words):
    one_line(*run("train.py", *args), *words)


def test_out_dir_under_a_file_fails_in_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    one_line(*run("train.py", "--out_dir", str(tmp_path / "f" / "run")), f"{tmp_path / 'f'} is a file, not a folder")


def test_temperature_0_warns_in_one_line():
    """--temperature 0 trains on greedy groups whose rollouts are alike: a one-line warning at start-up (the
    config is still valid: --help exits before any run)."""
    from config import get_config
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        get_config(["--temperature", "0"])
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("warning: --temperature 0:")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        get_config([])
    assert err.getvalue() == ""


def test_table_of_a_folder_without_runs_fails_in_one_line(tmp_path):
    one_line(*run("eval.py", "table", str(tmp_path)), f"eval.py table: no run under {tmp_path}")


def test_a_user_file_that_does_not_run_is_one_line(tmp_path):
    """A loss-term file with a syntax error: one line naming the file and line, not Python's traceback."""
    (tmp_path / "bad_loss.py").write_text("class Broken(:\n    pass\n")
    rc, err = run("train.py", "--loss_terms", "bad_loss:Broken", env={"PYTHONPATH": str(tmp_path)})
    one_line(rc, err, "--loss_terms", "'bad_loss' fails on import", "bad_loss.py, line 1")


def test_resume_auto_skips_a_truncated_checkpoint_in_one_line(tmp_path):
    """Two complete checkpoints; the newer one's model.safetensors cut short after it was written: --resume auto
    says so in one line naming the file and resumes from the older one; with both cut, a one-line error."""
    import torch
    from safetensors.torch import save_file
    from plumbing import ckpt
    for step in (10, 20):
        d = tmp_path / f"ckpt_{step:06d}"
        d.mkdir()
        save_file({"w": torch.zeros(64)}, str(d / "model.safetensors"))
        torch.save({"opt": {}}, d / "trainer.pt")
        (d / "state.json").write_text(json.dumps({"step": step}))
        (d / "COMPLETE").write_text("")
    f = tmp_path / "ckpt_000020" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-40])
    assert ckpt.unreadable(str(tmp_path / "ckpt_000010")) is None
    code = ("import sys; from plumbing import ckpt; p = ckpt.load('auto', sys.argv[1], False)[0]; print(p)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == str(tmp_path / "ckpt_000010"), p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: --resume auto: ") and str(f) in err[0], err
    assert "bytes, its header says" in err[0]
    g = tmp_path / "ckpt_000010" / "model.safetensors"
    g.write_bytes(g.read_bytes()[:-40])
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith("error: --resume auto: ")
    assert "no readable checkpoint" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("args, words", [
    (["--advantage", "gipgo"], ["unknown advantage estimator 'gipgo'", "gigpo", "module:Class"]),
    (["--advantage", "gigpo", "--step_gamma", "1.5"], ["--step_gamma 1.5: out of range", "(0, 1]"]),
    (["--advantage", "gigpo", "--adv_mode", "mean"], ["--adv_mode: invalid choice: 'mean'", "mean_std_norm"]),
    (["--dtype", "float16"], ["--dtype: invalid choice: 'float16'", "bfloat16"]),  # argparse's: one line too
    (["--advantage", "gigpo", "--similarity_thresh", "1"], ["--similarity_thresh 1", "[0, 1)"]),
    (["--advantage", "beacon", "--scheduler", "none", "--milestones", "/no/such/alfworld.json"],
     ["--milestones /no/such/alfworld.json: no such file"]),
    (["--advantage", "beacon"], ["--advantage beacon plays hint-free", "--scheduler g2"]),
    (["--milestones", "x.json"], ["--milestones is read by --advantage beacon"]),
])
def test_an_advantage_estimators_bad_flags_fail_in_one_line(args, words):
    one_line(*run("train.py", *args), *words)


@pytest.mark.parametrize("content, words", [
    ('{"trajectories": [', ["not valid JSON at line 1, column 19"]),
    ('{"trajectories": [{"id": "other_trial_T1", "actions": ["look"]}]}', ["names a training task"])])
def test_a_bad_milestone_file_fails_before_any_model_loads(tmp_path, content, words):
    f = tmp_path / "alfworld.json"
    f.write_text(content)
    one_line(*run("train.py", "--advantage", "beacon", "--scheduler", "none", "--milestones", str(f),
                  "--out_dir", str(tmp_path / "o"), "--engine", "hf"), f"--milestones {f}", *words)


def test_former_tracebacks_are_one_line(tmp_path):
    """An expert file that is not JSON names the file, line and column; an --out_dir that cannot be made fails
    before any model loads; `eval.py table --help` prints its usage."""
    bad = tmp_path / "expert.json"
    bad.write_text('{"trajectories": [{"id": 1,\n')
    one_line(*run("train.py", "--expert_data", str(bad)), f"--expert_data {bad}: not valid JSON at line 2, column 1")
    one_line(*run("train.py", "--out_dir", "/proc/no/such/run"), "--out_dir /proc/no/such/run: cannot create it")
    for sub in ("table", "dynamics"):
        p = subprocess.run([sys.executable, "eval.py", sub, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout.startswith(f"usage: python eval.py {sub} "), p.stdout + p.stderr


def test_a_step_the_run_cannot_hold_is_one_line(tmp_path):
    """|B| above the training set (a step draws each task once: more rollouts are --group_size), more live
    episodes on one env worker than plumbing/pool.py's MAX_LIVE, a prompt budget below the shortest prompt
    the run can build: one line each, before the rollout engine starts (the demo's training set: 80 tasks)."""
    base = ["train.py", "--out_dir", str(tmp_path / "o"), "--engine", "hf", "--num_workers", "1"]
    one_line(*run(*base, "--batch_tasks", "100000"), "--batch_tasks 100000 exceeds the training set (80 tasks)",
             "--group_size")
    one_line(*run(*base, "--batch_tasks", "80", "--group_size", "4"),  # 80 x 4 = 320 on one worker
             "one env worker would hold 320 live episodes at once, beyond its bound of 256", "--num_workers")
    rc, err = run(*base, "--max_prompt_tokens", "10")
    one_line(rc, err, "--max_prompt_tokens 10 is below the shortest prompt this run can build (")
    floor = int(err[0].split("build (")[1].split()[0])
    assert 10 < floor < 768  # the demo's budget (768) holds it

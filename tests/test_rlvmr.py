"""RLVMR (Table 1's Aux-RL row): its format rule, rule rewards, advantage, prompt, tagged data and cold start, on
inputs small enough to work out by hand from the reference functions (Tencent/DigitalHuman RLVMR/code, read at
zzjweb/digitalhuman 789ccd6): alfworld/projection.py alfworld_projection_rlvmr, rlvmr/core_rlvmr.py and
env_manager.py's meta-think prompt. Every expected number below is written out from the rule, not produced by
the code under test."""
import json
import math
import os
import subprocess
import sys
import types

import pytest

from variants.advantages import RLVMR, mr_rewards
from variants.formats import (RLVMR as FMT, action_list, check_steps, choices, plan_of, read, reply_text,
                              standin_reasons, tag_counts, tag_of)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPS = 1e-6


# ---- the format rule (alfworld_projection_rlvmr)
@pytest.mark.parametrize("text, want", [
    ("<planning>go to the fridge</planning>\n<action>go to fridge 1</action>", ("go to fridge 1", True, "go to the fridge")),
    # two skill pairs: skill_count 2
    ("<planning>p</planning><monitor>m</monitor><action>look</action>", ("look", False, "p")),
    # a skill pair after the action tag
    ("<action>look</action><explore>x</explore>", ("look", False, None)),
    # an empty pair is counted and not found: no non-empty skill
    ("<reflection>  </reflection><action>look</action>", ("look", False, None)),
    # an empty pair beside a full one: two pairs
    ("<reflection></reflection><monitor>m</monitor><action>look</action>", ("look", False, None)),
    # no skill pair at all; two action pairs (no action to play); a CJK character
    ("<action>look</action>", ("look", False, None)),
    ("<monitor>m</monitor><action>look</action><action>inventory</action>", (None, False, None)),
    ("<monitor>\u770b</monitor><action>look</action>", ("look", False, None)),
    # tags match case-insensitively; the action is stripped; an empty planning pair is no plan
    ("<MONITOR>m</MONITOR><Action>  look </Action>", ("look", True, None)),
    ("<explore>e</explore><planning> </planning><action>look</action>", ("look", False, None)),
])
def test_format_rule_by_hand(text, want):
    assert read(text) == want
    assert read(text, finished=False) == (None, False, None)  # a reply that ran out of tokens: nothing played


def test_tag_of_and_action_list_as_the_rewards_read_them():
    # substring checks, case-sensitive, planning before explore before reflection; monitor is "none"
    assert tag_of("<explore>a <planning> b</explore>") == "planning"
    assert [tag_of(f"<{t}>x</{t}>") for t in ("planning", "explore", "reflection", "monitor")] == \
        ["planning", "explore", "reflection", "none"]
    assert tag_of("<MONITOR>m</MONITOR><action>look</action>") == "none"
    assert action_list("<monitor>m</monitor><action> look</action>") == [" look"]  # unstripped
    assert action_list("<action>go\nto</action>") == []  # one line only


def test_tag_counts_read_the_one_pair_not_the_rewards_substrings():
    # the step record's tags, whatever the estimator: a valid reply's one skill pair (case-insensitive; an
    # unclosed "<planning>" inside <explore> is no pair), monitor by name, any format-invalid reply "invalid"
    rows = [{"text": "<planning>p</planning>\n<action>look</action>", "format": True},
            {"text": "<explore>a <planning> b</explore><action>go</action>", "format": True},
            {"text": "<MONITOR>m</MONITOR><action>look</action>", "format": True},
            {"text": "<monitor>go on</monitor><action>open drawer 1</action>", "format": True},
            {"text": "<monitor>m</monitor><explore>e</explore><action>x</action>", "format": False},
            {"text": "<reflection>r</reflection><action>x</action>", "format": True}]
    assert tag_counts(rows) == {"tag_planning": 1, "tag_explore": 1, "tag_monitor": 2, "tag_invalid": 1,
                                "tag_reflection": 1}
    assert tag_of(rows[1]["text"]) == "planning"  # where the rewards' substring rule differs


# ---- the rule rewards (process_trajectory_rlvmr_rewards)
def row(text, fmt=True, available=True, gid=0, eid="A", t=0):
    return {"text": text, "format": fmt, "available": available, "gid": gid, "eid": eid, "t": t}


def act(tag, action):
    return f"<{tag}>x</{tag}><action>{action}</action>"


def test_rule_rewards_by_hand():
    steps = [row(act("reflection", "go to a")),  # step 0: no previous row -> "" and invalid: rewarded
             row(act("explore", "go to b")),  # differs from every earlier valid action: 1
             row(act("explore", "go to a")),  # repeats step 0's action (valid): 0
             row(act("monitor", "open b"), available=False),  # "none", 0
             row(act("reflection", "open b")),  # previous not admissible, but the same action: 0
             row(act("reflection", "look")),  # previous valid and admissible: 0
             row(act("explore", "go to c"), fmt=False),  # format-invalid: "none", 0
             row(act("explore", "go to c")),  # the earlier "go to c" was invalid: not a repeat, 1
             row(act("planning", "go to d"))]  # 1 iff the episode is won
    tags = ["reflection", "explore", "explore", "none", "reflection", "reflection", "none", "explore", "planning"]
    assert mr_rewards(steps, won=True) == (tags, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    assert mr_rewards(steps, won=False)[1] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    after_bad = [row(act("monitor", "open b"), available=False), row(act("reflection", "look"))]
    assert mr_rewards(after_bad, won=False)[1] == [0.0, 1.0]  # previous not admissible, a new action: 1
    after_invalid = [row("<action>look</action>", fmt=False), row(act("reflection", "look"))]
    assert mr_rewards(after_invalid, won=False)[1] == [0.0, 0.0]  # the same action list: 0


# ---- the advantage (compute_rlvmr_outcome_advantage)
def cfg(**kw):
    base = dict(adv_mode="mean_std_norm", step_adv_w=1.0, rlvmr_alpha=0.0, reward_scale=10.0, invalid_penalty=0.1)
    return types.SimpleNamespace(**{**base, **kw})


def batch():
    """Group 0: A won in 2 rows (planning, explore to a new place); B lost in 3 (planning, explore repeating
    its own first action, monitor). Group 1: C lost in 1 row, a reflection at step 0 (a singleton tag group)."""
    rows = [row(act("planning", "go to a"), eid="A", t=0), row(act("explore", "go to b"), eid="A", t=1),
            row(act("planning", "go to a"), eid="B", t=0), row(act("explore", "go to a"), eid="B", t=1),
            row(act("monitor", "look"), eid="B", t=2), row(act("reflection", "look"), gid=1, eid="C", t=0)]
    episodes = [{"eid": e, "won": e == "A", "task_id": "t", "n": 0, "error": None} for e in "ABC"]
    return rows, episodes


def test_rlvmr_advantage_by_hand():
    rows, eps = batch()
    est = RLVMR(cfg())
    assert est(rows, eps) == (0, 2)
    # A^traj, group 0: scores 10, 10, 0, 0, 0 -> mean 4, unbiased std sqrt(120 / 4) = sqrt(30)
    up, down = 6 / (math.sqrt(30) + EPS), -4 / (math.sqrt(30) + EPS)
    # A^MR: (0, planning) [1, 0] and (0, explore) [1, 0] -> +-0.5 / (sqrt(0.5) + eps); (0, none) [0]: a
    # singleton keeps 0; group 1: A^traj of one row keeps its score 0, (1, reflection) [1] keeps its raw 1
    half = 0.5 / (math.sqrt(0.5) + EPS)
    want = [up + half, up + half, down - half, down - half, down, 1 / (1 + EPS)]
    assert [r["adv"] for r in rows] == pytest.approx(want, abs=1e-9)
    assert est.stats()["adv_mr_reward"] == pytest.approx(3 / 6)  # A's two rows and C's reflection
    assert est.stats()["adv_tag_none"] == pytest.approx(1 / 6)


def test_both_weightings_by_hand():
    rows, eps = batch()
    RLVMR(cfg(step_adv_w=0.5))(rows, eps)  # the yaml's w: A^traj + 0.5 A^MR
    up, half = 6 / (math.sqrt(30) + EPS), 0.5 / (math.sqrt(0.5) + EPS)
    assert rows[0]["adv"] == pytest.approx(up + 0.5 * half) and rows[5]["adv"] == pytest.approx(0.5 / (1 + EPS))
    RLVMR(cfg(rlvmr_alpha=0.5, step_adv_w=3.0))(rows, eps)  # the paper's convex 0.5 / 0.5 (w unread)
    assert rows[0]["adv"] == pytest.approx(0.5 * up + 0.5 * half)
    assert rows[4]["adv"] == pytest.approx(0.5 * -4 / (math.sqrt(30) + EPS))
    RLVMR(cfg(adv_mode="mean_norm"))(rows, eps)  # mean_norm: no division
    assert [r["adv"] for r in rows] == pytest.approx([6.5, 6.5, -4.5, -4.5, -4.0, 1.0])


def test_a_format_invalid_row_loses_the_penalty_in_the_episode_part():
    rows = [row("<action>look</action>", fmt=False, eid="A"), row(act("monitor", "look"), eid="A", t=1),
            row(act("monitor", "look"), eid="B")]
    eps = [{"eid": e, "won": False, "task_id": "t", "n": 0, "error": None} for e in "AB"]
    RLVMR(cfg(adv_mode="mean_norm"))(rows, eps)
    # scores -0.1, 0, 0 -> mean -0.1 / 3; every tag is "none" with reward 0
    assert [r["adv"] for r in rows] == pytest.approx([-0.1 + 0.1 / 3, 0.1 / 3, 0.1 / 3])


# ---- the prompt (env_manager.py build_text_obs, meta_think) and the constrained decoder's replies
def test_the_prompt_of_a_three_step_episode_carries_the_plan():
    from config import Config
    from rollout import user_message
    c = Config(prompt="rlvmr", history_length=2)
    hist = [("You are in a room.", "go to fridge 1"), ("The fridge 1 is closed.", "open fridge 1"),
            ("You open the fridge 1.", "go to shelf 1")]
    outs = [(hist[0][0], "<planning>fridge, then shelf</planning>\n<action>go to fridge 1</action>"),
            (hist[1][0], "<monitor>open it</monitor>\n<action>open fridge 1</action>"),
            (hist[2][0], "<explore>a shelf</explore>\n<action>go to shelf 1</action>")]
    msg = user_message("cool an egg.", "a room", hist, "You arrive at shelf 1.", ["look", "take egg 1"], 3, c,
                       "", outs)
    assert msg.splitlines() == [
        "You are an agent in a household text world. Your task is to: cool an egg.",
        "You have already taken 3 step(s).",
        "Your most recent 2 observation(s) and action(s):",
        "[Observation 2: 'The fridge 1 is closed.', Action 2: 'open fridge 1']",
        "[Observation 3: 'You open the fridge 1.', Action 3: 'go to shelf 1']",
        "Your recent reasoning:",
        "[Observation 1: You are in a room., output: '<planning>fridge, then shelf</planning>",
        "<action>go to fridge 1</action>']",
        "[Observation 2: The fridge 1 is closed., output: '<monitor>open it</monitor>",
        "<action>open fridge 1</action>']",
        "[Observation 3: You open the fridge 1., output: '<explore>a shelf</explore>",
        "<action>go to shelf 1</action>']",
        "You are now at step 4 and your current observation is: You arrive at shelf 1.",
        "The actions you can take now: look, take egg 1",
        "Your previous overall plan is: fridge, then shelf. Please strictly adhere to your plan.",
        msg.splitlines()[-1]]
    assert "exactly one tag pair" in msg.splitlines()[-1]
    first = user_message("cool an egg.", "a room", [], "You are in a room.", ["look"], 0, c, "", [])
    assert "Your previous overall plan is: No plan." in first and "recent reasoning" not in first
    # the latest non-empty plan wins; an empty one leaves it
    assert plan_of(outs + [("o", "<planning>shelf</planning><action>look</action>")]) == "shelf"
    assert plan_of(outs + [("o", "<planning> </planning><action>look</action>")]) == "fridge, then shelf"
    short = user_message("cool an egg.", "a room", hist, "You arrive at shelf 1.", ["look", "take egg 1"], 3,
                         Config(prompt="rlvmr_compact", constrained=True), "", outs)
    assert short.splitlines() == [
        "task: cool an egg.", "room: a room", "done: go to fridge 1 | open fridge 1 | go to shelf 1",
        "recent: <planning>fridge, then shelf</planning> <action>go to fridge 1</action> | <monitor>open it"
        "</monitor> <action>open fridge 1</action> | <explore>a shelf</explore> <action>go to shelf 1</action>",
        "plan: fridge, then shelf", "now: You arrive at shelf 1."]


def test_the_constrained_decoder_allows_each_tag_before_each_command(tiny_tok):
    from rollout import choice_ids, expert_ids
    tok = tiny_tok
    got = choice_ids(tok, ["look", "go to desk 1"], FMT)
    assert len(got) == 8 and all(ids[-1] == tok.eos_token_id for ids in got)
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in got]
    assert texts == choices("look") + choices("go to desk 1")
    assert all(read(t) == (cmd, True, read(t)[2]) for t, cmd in zip(texts, ["look"] * 4 + ["go to desk 1"] * 4))
    # an expert step's target under the format: its tagged reason, then the action, on a path the decoder allows
    reason = standin_reasons(["go to desk 1"])[0]
    assert expert_ids(tok, "go to desk 1", reason, FMT) in got


@pytest.fixture(scope="module")
def tiny_tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(os.path.join(ROOT, "checkpoints", "sft_base"))


# ---- tagged trajectories: the stand-in and the reader's one-line errors
def test_standin_tags_by_its_stated_rule():
    acts = ["look", "go to shelf 1", "take mug 1 from shelf 1", "go to shelf 2", "go to shelf 1", "open fridge 1",
            "put mug 1 in/on fridge 1"]
    tags = [r.split(">")[0][1:] for r in standin_reasons(acts)]
    assert tags == ["planning", "explore", "explore", "explore", "monitor", "explore", "monitor"]
    assert all(read(reply_text(r, a))[1] for r, a in zip(standin_reasons(acts), acts))


def test_a_tagged_file_is_read_and_checked(tmp_path):
    from plumbing.expert_data import read_expert_file
    good = {"trajectories": [{"id": "trial_1", "traj": [{"reason": "<planning>p</planning>", "action": "look"},
                                                        {"reason": "<monitor>m</monitor>", "action": "go to x 1"}]}]}
    p = tmp_path / "tagged.json"
    p.write_text(json.dumps(good))
    entries = read_expert_file(str(p))
    assert entries == [{"id": "trial_1", "actions": ["look", "go to x 1"],
                        "thinks": ["<planning>p</planning>", "<monitor>m</monitor>"]}]
    check_steps(str(p), entries)
    bad = [{"id": "trial_1", "actions": ["look"], "thinks": ["I look around"]}]
    with pytest.raises(ValueError, match=r"entry 'trial_1' step 0: .* not a reply in RLVMR's format"):
        check_steps(str(p), bad)
    p.write_text(json.dumps({"trajectories": [{"id": "x", "traj": [{"action": "look"}]}]}))
    with pytest.raises(ValueError, match=r"\"traj\" must be a list of"):
        read_expert_file(str(p))


def run(*args, timeout=600):
    p = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"})
    return p.returncode, p.stderr.strip().splitlines(), p


@pytest.mark.parametrize("args, words", [
    (["--advantage", "rlvmr"], ["--advantage rlvmr rewards RLVMR's tags", "--prompt rlvmr",
                                "constrained decoder emits action tags only"]),
    (["--advantage", "rlvmr", "--prompt", "full", "--constrained", "0"], ["--prompt full's replies carry none)"]),
    (["--prompt", "rlvmr", "--env", "webshop"], ["RLVMR has no WebShop path", "--env webshop"]),
    (["--prompt", "rlvmr_compact", "--mode", "sft_full"], ["need tagged replies", "python -m variants.formats"]),
    (["--prompt", "rlvmr", "--expert_data", "/no/such/tagged.json"], ["/no/such/tagged.json: no such file"]),
])
def test_bad_rlvmr_settings_fail_in_one_line(args, words):
    rc, err, _ = run(*args)
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err[-5:]
    assert all(w in err[0] for w in words), err[0]


@pytest.mark.parametrize("content, words", [
    ("{not json", ["not valid JSON at line 1"]),
    (json.dumps({"trajectories": [{"id": "t", "actions": ["look"], "think": ["I look"]}]}),
     ["entry 't' step 0", "not a reply in RLVMR's format"]),
])
def test_a_bad_tagged_file_fails_in_one_line(tmp_path, content, words):
    p = tmp_path / "tagged.json"
    p.write_text(content)
    rc, err, _ = run("--prompt", "rlvmr_compact", "--mode", "sft_full", "--expert_data", str(p))
    assert rc == 2 and len(err) == 1 and all(w in err[0] for w in words), err[-3:]


# ---- the cold start, then two steps of RLVMR from it
@pytest.mark.slow
def test_two_rlvmr_steps_from_the_standin_cold_start(tmp_path):
    from variants.formats import standin
    tagged = tmp_path / "standin.json"
    assert standin(str(tagged)) == 240
    small = ["--preset", "cpu_mix6", "--prompt", "rlvmr_compact", "--max_new_tokens", "48", "--batch_tasks", "2",
             "--group_size", "2", "--max_steps", "6", "--eval_games", "-1", "--num_workers", "1", "--engine", "hf",
             "--scheduler", "none"]
    rc, err, p = run(*small, "--mode", "sft_full", "--expert_data", str(tagged), "--steps", "2", "--lr", "1e-3",
                     "--out_dir", str(tmp_path / "cold"))
    assert rc == 0, p.stdout[-1500:] + p.stderr[-1500:]
    cold = [json.loads(x) for x in open(tmp_path / "cold" / "log.jsonl") if '"eval"' not in x]
    assert all(r["aux"] > 0 for r in cold) and cold[1]["aux"] < cold[0]["aux"]  # it fits the tags
    rc, err, p = run(*small, "--model", str(tmp_path / "cold" / "ckpt_000002"), "--advantage", "rlvmr", "--adv_mode",
                     "mean_std_norm", "--reward_scale", "10", "--invalid_penalty", "0.1", "--steps", "2",
                     "--out_dir", str(tmp_path / "rl"))
    assert rc == 0, p.stdout[-1500:] + p.stderr[-1500:]
    recs = [json.loads(x) for x in open(tmp_path / "rl" / "log.jsonl") if '"eval"' not in x]
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:  # every reply in format (the decoder allows no other), the tags' shares sum to 1
        assert r["invalid"] == 0 and r["adv_tag_none"] < 1
        assert sum(r[f"adv_tag_{t}"] for t in ("planning", "explore", "reflection", "none")) == pytest.approx(1)
        tags = r["tags"]  # the record's shares by written tag: the estimator's, monitor and invalid as "none"
        assert sum(tags.values()) == pytest.approx(1) and "invalid" not in tags
        assert tags.get("explore", 0) == pytest.approx(r["adv_tag_explore"])
        assert tags.get("monitor", 0) == pytest.approx(r["adv_tag_none"])
        assert (r["update_rel"] > 0) == (r["zero_adv_groups"] < r["groups"])
    assert json.load(open(tmp_path / "rl" / "config.json"))["prompt"] == "rlvmr_compact"

"""The advantage estimators beside GRPO (variants/advantages.py) and BEACON's WebShop milestones
(plumbing/milestones.py), on inputs small enough to work out by hand from the reference functions:
GiGPO's gigpo/core_gigpo.py and BEACON's migpo/core_migpo.py and migpo/webshop_milestone_detector.py
(ZJU-REAL/BEACON db9347f; the GiGPO file is byte-identical to verl-agent's d0b9724). Every expected number
below is written out from the rule, not produced by the code under test."""
import json
import math
import types

import pytest

from variants.advantages import (BEACON, GiGPO, anchor_groups, match_milestones, read_milestones,
                                 segments_from_flags, segments_from_matches)

EPS = 1e-6


def cfg(**kw):
    base = dict(adv_mode="mean_norm", step_adv_w=1.0, step_gamma=0.5, reward_scale=10.0, invalid_penalty=0.1,
                similarity_thresh=0.0, milestone_thresh=0.95, milestones="", env="alfworld", expert_data="")
    return types.SimpleNamespace(**{**base, **kw})


def row(gid, eid, t, obs="", valid=True, action="", milestone=False):
    return {"gid": gid, "eid": eid, "t": t, "obs": obs, "valid": valid, "action": action, "milestone": milestone}


def ep(eid, won, task_id="task", n=0):
    return {"eid": eid, "won": won, "task_id": task_id, "n": n, "error": None}


def gigpo_group():
    """Group 0: episode A won in 2 steps (anchors o0, o1); episode B lost in 3 (o0, then o2 twice: a place
    revisited; its middle step invalid)."""
    rows = [row(0, "A", 0, "o0"), row(0, "A", 1, "o1"),
            row(0, "B", 0, "o0"), row(0, "B", 1, "o2", valid=False), row(0, "B", 2, "o2")]
    return rows, [ep("A", True), ep("B", False)]


def test_gigpo_mean_norm_by_hand():
    rows, eps = gigpo_group()
    n_zero, n_groups = GiGPO(cfg())(rows, eps)
    # row scores 10*won - 0.1*invalid: 10, 10, 0, -0.1, 0; their mean over the group's 5 rows (cross-step) 3.98
    # returns (gamma 0.5): A 5, 10; B 0, 0 - 0.1, 0 (the penalty after discounting, not propagated)
    # anchor groups: o0 {A0 5, B0 0} mean 2.5; o1 {A1} alone -> 0; o2 {B1 -0.1, B2 0} mean -0.05
    want = [6.02 + 2.5, 6.02 + 0.0, -3.98 - 2.5, -4.08 - 0.05, -3.98 + 0.05]
    assert [r["adv"] for r in rows] == pytest.approx(want, abs=1e-9)
    assert (n_zero, n_groups) == (0, 1)


def test_gigpo_mean_std_norm_by_hand():
    rows, eps = gigpo_group()
    GiGPO(cfg(adv_mode="mean_std_norm"))(rows, eps)
    sd_e = math.sqrt((2 * 6.02 ** 2 + 2 * 3.98 ** 2 + 4.08 ** 2) / 4)  # unbiased (torch.std)
    sd_o0, sd_o2 = math.sqrt(2 * 2.5 ** 2), math.sqrt(2 * 0.05 ** 2)
    want = [6.02 / (sd_e + EPS) + 2.5 / (sd_o0 + EPS), 6.02 / (sd_e + EPS),
            -3.98 / (sd_e + EPS) - 2.5 / (sd_o0 + EPS), -4.08 / (sd_e + EPS) - 0.05 / (sd_o2 + EPS),
            -3.98 / (sd_e + EPS) + 0.05 / (sd_o2 + EPS)]
    assert [r["adv"] for r in rows] == pytest.approx(want, abs=1e-6)


def test_gigpo_omega_and_a_lone_row():
    # a group of one row: the episode part keeps its score (mean 0, std 1: episode_norm_reward l.225-227),
    # the step part is 0 (a singleton anchor: step_norm_reward l.367-369)
    rows = [row(5, "C", 0, "x")]
    GiGPO(cfg(step_adv_w=3.0))(rows, [ep("C", True)])
    assert rows[0]["adv"] == pytest.approx(10.0)
    GiGPO(cfg(adv_mode="mean_std_norm"))(rows, [ep("C", True)])
    assert rows[0]["adv"] == pytest.approx(10.0 / (1 + EPS))
    # omega scales the step part only: omega 3 on the mean_norm group above
    rows, eps = gigpo_group()
    GiGPO(cfg(step_adv_w=3.0))(rows, eps)
    assert rows[0]["adv"] == pytest.approx(6.02 + 3 * 2.5) and rows[1]["adv"] == pytest.approx(6.02)


def test_gigpo_groups_that_learn_nothing_are_counted():
    # two lost one-step episodes on one anchor, all valid: every score and return equal -> every advantage 0
    rows = [row(0, "A", 0, "o"), row(0, "B", 0, "o"), row(1, "C", 0, "o"), row(1, "D", 0, "p")]
    n_zero, n_groups = GiGPO(cfg())(rows, [ep("A", False), ep("B", False), ep("C", True), ep("D", False)])
    assert (n_zero, n_groups) == (1, 2)
    assert [r["adv"] for r in rows[:2]] == [0.0, 0.0]


def test_similarity_mode_depends_on_the_order_and_takes_the_boundary():
    # SequenceMatcher ratios worked by hand: 'aaaa'/'aaab' 2*3/8 = 0.75, 'aaab'/'aabb' (block 'aab') 0.75,
    # 'aaaa'/'aabb' 2*2/8 = 0.5. At 0.75 a ratio equal to the threshold joins (>=, are_similar l.85).
    x, y, z = "aaaa", "aaab", "aabb"
    keys = anchor_groups([row(0, "A", 0, x), row(0, "A", 1, y), row(0, "A", 2, z)], 0.75)
    assert keys[0] == keys[1] != keys[2]  # y joins x's cluster; z is 0.5 from x, the representative
    keys = anchor_groups([row(0, "A", 0, z), row(0, "A", 1, y), row(0, "A", 2, x)], 0.75)
    assert keys[0] == keys[1] != keys[2]  # reversed: y joins z's cluster instead
    # ALFWorld near misses at 0.95: 'go to drawer 1' / 'go to drawer 10' 2*14/29 = 0.966 joins;
    # 'go to countertop 1' / '... 2' 2*17/36 = 0.944 does not; each task group clusters alone
    keys = anchor_groups([row(0, "A", 0, "go to drawer 1"), row(0, "A", 1, "go to drawer 10"),
                          row(0, "A", 2, "go to countertop 1"), row(0, "A", 3, "go to countertop 2"),
                          row(1, "B", 0, "go to drawer 1")], 0.95)
    assert keys[0] == keys[1] and keys[2] != keys[3] and keys[4] != keys[0]
    assert anchor_groups([row(0, "A", 0, "a"), row(0, "B", 0, "a"), row(1, "C", 0, "a")]) == \
        [(0, "a"), (0, "a"), (1, "a")]  # exact mode: equality within the task group only
    # WebShop after an invalid step: the page is unchanged (the wrapper's prefix is not WebShop's): one anchor
    page = "Back to Search [SEP] Page 1 (Total results: 3)"
    assert anchor_groups([row(0, "A", 1, page), row(0, "A", 2, "Invalid action. " + page)]) == [(0, page)] * 2


def test_agent_g2_on_top_of_gigpo_counts_only_the_policys_steps():
    # a hinted group at depth n = 2: the rows start at t = 2 (the replayed prefix makes aux rows, not rows); A
    # wins at its 2nd own step, B loses after 3; both start from the same replayed state 'p'
    rows = [row(0, "A", 2, "p"), row(0, "A", 3, "q"),
            row(0, "B", 2, "p"), row(0, "B", 3, "r"), row(0, "B", 4, "s")]
    GiGPO(cfg(invalid_penalty=0.0))(rows, [ep("A", True, n=2), ep("B", False, n=2)])
    # scores 10, 10, 0, 0, 0: mean 4 -> 6, 6, -4, -4, -4; returns A 5, 10, B 0, 0, 0: anchor p {5, 0} -> +-2.5
    assert [r["adv"] for r in rows] == pytest.approx([8.5, 6.0, -6.5, -4.0, -4.0])


MILESTONES = ["go to countertop 1", "take apple 1 from countertop 1", "go to fridge 1", "cool apple 1 with fridge 1"]


def test_milestone_matching_by_hand():
    acts = ["go to countertop 2",              # 0.944 < 0.95: no match
            "go to countertop 1",              # milestone 0
            "take apple 2 from countertop 1",  # 2*29/60 = 0.967: milestone 1 (another object: a near match)
            "go to fridge 1", "cool apple 1 with fridge 1",  # milestones 2, 3
            "look"]                            # after the last milestone
    m = match_milestones(acts, MILESTONES, 0.95)
    assert m == [1, 2, 3, 4]
    rewards, seg = segments_from_matches(len(acts), m, 0.5)
    assert rewards == [0.5, 1.0, 1.0, 1.0, 1.0, 0.0] and seg == [0, 0, 1, 2, 3, -1]  # post-completion: -1
    m = match_milestones(["go to countertop 1", "go to sinkbasin 1", "look"], MILESTONES, 0.95)
    assert m == [0, -1, -1, -1]  # milestone 1 never matched, so neither are the later ones
    assert segments_from_matches(3, m, 0.5) == ([1.0, 0.0, 0.0], [0, 1, 1])  # failed attempts: segment 1, 0
    # in order: a later milestone played first does not match until its predecessors have
    assert match_milestones(["go to fridge 1", "go to countertop 1"], MILESTONES, 0.95) == [1, -1, -1, -1]


def test_beacon_alfworld_advantage_by_hand():
    tasks = [{"id": "t", "walkthrough": MILESTONES}]
    acts_a = ["go to countertop 2", "go to countertop 1", "take apple 2 from countertop 1", "go to fridge 1",
              "cool apple 1 with fridge 1", "look"]
    acts_b = ["go to countertop 1", "go to sinkbasin 1", "look"]
    rows = ([row(0, "A", t, action=a) for t, a in enumerate(acts_a)]
            + [row(0, "B", t, action=a) for t, a in enumerate(acts_b)])
    est = BEACON(cfg(invalid_penalty=0.0), tasks)
    est(rows, [ep("A", True, "t"), ep("B", False, "t")])
    # A^E: scores 10 x6, 0 x3, mean 60/9 -> A +10/3, B -20/3
    # step rewards x10: A 5, 10, 10, 10, 10, 0 (segments 0 0 1 2 3 -1); B 10, 0, 0 (segments 0 1 1)
    # (0,0) {5, 10, 10} mean 25/3; (0,1) {10, 0, 0} mean 10/3; segments 2, 3, -1 alone -> 0
    want = [10 / 3 + 5 - 25 / 3, 10 / 3 + 10 - 25 / 3, 10 / 3 + 10 - 10 / 3, 10 / 3, 10 / 3, 10 / 3,
            -20 / 3 + 10 - 25 / 3, -20 / 3 - 10 / 3, -20 / 3 - 10 / 3]
    assert [r["adv"] for r in rows] == pytest.approx(want, abs=1e-9)
    assert est.stats()["adv_milestones"] == 4 + 1
    # lambda 10 (BEACON's ALFWorld script) scales the segment part only
    BEACON(cfg(invalid_penalty=0.0, step_adv_w=10.0), tasks)(rows, [ep("A", True, "t"), ep("B", False, "t")])
    assert rows[0]["adv"] == pytest.approx(10 / 3 + 10 * (5 - 25 / 3))


def test_beacon_a_task_without_milestones_gets_the_episode_part(capsys):
    est = BEACON(cfg(invalid_penalty=0.0), [{"id": "t", "walkthrough": MILESTONES}, {"id": "u", "walkthrough": []}])
    assert "1 training task(s) have no milestones" in capsys.readouterr().out
    rows = [row(0, "A", 0, action="go to countertop 1"), row(0, "B", 0, action="look")]
    est(rows, [ep("A", True, "u"), ep("B", False, "u")])
    assert [r["adv"] for r in rows] == pytest.approx([5.0, -5.0])  # A^E alone: 10, 0 about their mean 5


def test_webshop_segments_from_flags_by_hand():
    rewards, seg = segments_from_flags([False, True, False, False, True, False], 0.5)
    assert rewards == [0.5, 1.0, 0.25, 0.5, 1.0, 0.0]
    assert seg == [0, 0, 1, 1, 1, 2]  # flagged steps before it in its episode
    # BEACON on WebShop rows: the flags ride on the rows (the env's detector); a singleton segment gets 0
    rows = [row(0, "A", 0, milestone=True), row(0, "A", 1), row(0, "B", 0)]
    BEACON(cfg(env="webshop", invalid_penalty=0.0), None)(rows, [ep("A", True), ep("B", False)])
    # A^E: 10, 10, 0 (mean 20/3); step rewards 10, 0, 0; segments (0,0) {A0 10, B0 0} mean 5, (0,1) {A1} alone
    assert [r["adv"] for r in rows] == pytest.approx([10 / 3 + 5, 10 / 3, -20 / 3 - 5])


def test_milestone_file_read_and_matched_by_trial(tmp_path):
    task = {"id": "a/trial_T1", "gamefile": "/g/pick_and_place_simple-Mug-None-Desk-308/trial_T1/game.tw-pddl",
            "walkthrough": ["x"]}
    f = tmp_path / "alfworld.json"
    f.write_text(json.dumps({"trajectories": [{"id": "pick_and_place_simple-Mug-None-Desk-308_trial_T1",
                                               "task_type": "pick_and_place_simple", "actions": ["go to desk 1"]}]}))
    assert read_milestones(str(f), [task]) == {"a/trial_T1": ["go to desk 1"]}
    f.write_text(json.dumps({"trajectories": [{"id": "other_trial_T9", "actions": ["look"]}]}))
    with pytest.raises(ValueError, match="names a training task"):
        read_milestones(str(f), [task])
    f.write_text('{"trajectories": [')
    with pytest.raises(ValueError, match=r"--milestones .*line 1"):
        read_milestones(str(f), [task])
    f.write_text(json.dumps({"trajectories": [{"id": "x_trial_T1", "actions": "go"}]}))
    with pytest.raises(ValueError, match="must be a list of strings"):
        read_milestones(str(f), [task])


# ---------------------------------------------------------------------------------------------------------
# WebShop's four phases (plumbing/milestones.py)
# ---------------------------------------------------------------------------------------------------------
def product(asin, title, attrs, options, price):
    return {"asin": asin, "Title": title, "Description": "", "BulletPoints": [], "Attributes": attrs,
            "options": options, "price": price}


PRODUCTS = {"B000000001": product("B000000001", "red cotton shirt", ["cotton"],
                                  {"color": ["red", "blue"], "size": ["small", "large"]}, 10.0),
            "B000000002": product("B000000002", "blue wool shirt", ["wool"], {"color": ["blue"]}, 50.0)}
PRICES = {a: p["price"] for a, p in PRODUCTS.items()}


def results(*asins):
    return " [SEP] ".join(["Back to Search", f"Page 1 (Total results: {len(asins)})", "Next >"]
                          + [x for a in asins for x in (a, PRODUCTS[a]["Title"], f"${PRICES[a]}")])


def test_webshop_phases_in_order():
    from plumbing.milestones import Milestones
    from plumbing.webshop import attribute_matches
    goal = {"attributes": ["cotton"], "goal_options": {"color": "red", "size": "large"}, "price_upper": 20.0}
    m = Milestones(goal, PRODUCTS, PRICES, attribute_matches)
    steps = [("click[b000000001]", "x", False),                   # search phase: not a search
             ("search[shirt]", results("B000000002"), False),     # no listed product can meet the goal
             ("search[cotton shirt]", results("B000000001"), True),  # 1. search
             ("click[b000000002]", "x", False),                   # wool, $50: cannot meet it
             ("click[b000000001]", "x", True),                    # 2. detail
             ("click[red]", "x", False),                          # one of the two goal options
             ("click[large]", "x", True),                         # 3. options
             ("click[description]", "x", False),                  # purchase phase: not buy now
             ("click[buy now]", "x", True),                       # 4. purchase
             ("click[buy now]", "x", False)]                      # complete: nothing more
    assert [m.step(a, o) for a, o, _ in steps] == [want for _, _, want in steps]


def test_webshop_phases_goal_without_options_and_a_failed_purchase():
    from plumbing.milestones import Milestones
    from plumbing.webshop import attribute_matches
    goal = {"attributes": ["cotton"], "goal_options": {}, "price_upper": 20.0}
    m = Milestones(goal, PRODUCTS, PRICES, attribute_matches)
    # detail done -> the options milestone is skipped: the next milestone is the purchase
    assert [m.step(a, o) for a, o in [("search[cotton]", results("B000000001")), ("click[b000000001]", "x"),
                                       ("click[buy now]", "x")]] == [True, True, True]
    # a goal whose option the shopper never picked: buy now does not satisfy it, however often
    goal = {"attributes": ["cotton"], "goal_options": {"color": "red"}, "price_upper": 20.0}
    m = Milestones(goal, PRODUCTS, PRICES, attribute_matches)
    m.step("search[cotton]", results("B000000001"))
    m.step("click[b000000001]", "x")
    m.phase = "purchase"  # as if the options phase had passed without a match
    assert [m.step("click[buy now]", "x") for _ in range(2)] == [False, False] and m.phase == "purchase"
    # the reference's parse: 'name[arg]' as written, so a padded ASIN is not 10 characters and no product
    m = Milestones(goal, PRODUCTS, PRICES, attribute_matches)
    m.step("search[cotton]", results("B000000001"))
    assert m.step("click[ b000000001]", "x") is False and m.step("click[b000000001]", "x") is True


def test_the_lite_site_flags_the_scripted_experts_milestones():
    """The env side, unfaked: webshop-lite with BEACON's detector on (the worker spec's "milestones") flags the
    scripted expert's winning episode, in order, on the steps that reach each milestone."""
    from plumbing.webshop import WebShopEnv, scripted_expert
    spec = {"env": "webshop", "backend": "lite", "seed": 0, "products": 520, "max_steps": 15, "milestones": True}
    env = WebShopEnv(spec)
    for i in (0, 1, 2):
        walk, score = scripted_expert(env, i)
        assert score == 1.0
        ep, flags = env.reset(i), []
        for a in walk:
            env.step(ep, a)
            flags.append(ep["milestone"])
        goal = env.goals[i]
        want = 4 if goal["goal_options"] else 3  # no goal options: the options milestone is skipped
        assert sum(flags) == want and flags[-1] and ep["phases"].phase == "complete", (i, walk, flags)
        assert walk[flags.index(True)].startswith("search[")  # the first: a search that lists the product


@pytest.mark.slow
@pytest.mark.parametrize("env,argv", [
    ("alfworld", ["--scheduler", "g2", "--advantage", "gigpo", "--adv_mode", "mean_std_norm"]),  # Agent-G² + GiGPO
    ("alfworld", ["--scheduler", "none", "--advantage", "beacon", "--step_adv_w", "10", "--step_gamma", "0.9"]),
    ("webshop", ["--scheduler", "none", "--advantage", "gigpo", "--similarity_thresh", "0.95"]),
    ("webshop", ["--scheduler", "none", "--advantage", "beacon"])])
def test_two_training_steps_of_each_estimator(tmp_path, env, argv):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # webshop-lite's base wins rarely: 4 x 4 rollouts, its preset's 15 steps, for a group with something to learn
    size = (["--preset", "cpu_webshop", "--batch_tasks", "4", "--group_size", "4"] if env == "webshop" else
            ["--batch_tasks", "2", "--group_size", "2", "--max_steps", "8"])
    p = subprocess.run([sys.executable, "train.py", *size, *argv, "--steps", "2", "--eval_games", "-1",
                        "--train_panel", "0",
                        "--num_workers", "1", "--ckpt_every", "0", "--engine", "hf", "--reward_scale", "10",
                        "--invalid_penalty", "0.1", "--out_dir", str(tmp_path)],
                       cwd=root, capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    recs = [json.loads(x) for x in open(tmp_path / "log.jsonl") if '"eval"' not in x]
    assert [r["step"] for r in recs] == [0, 1]
    for r in recs:
        assert all(r[k] == r[k] and abs(r[k]) < 1e4 for k in ("pg", "grad_norm"))
        assert ("adv_step_groups" in r) == ("gigpo" in argv) and ("adv_segments" in r) == ("beacon" in argv)
        # the weights move when a group has a non-zero advantage (hint-free: nothing else trains), and with hints
        # L_aux moves them anyway
        assert (r["update_rel"] > 0) == (r["zero_adv_groups"] < r["groups"] or "g2" in argv), r
    assert any(r["zero_adv_groups"] < r["groups"] for r in recs)  # the estimator gave something to learn from
    if env == "alfworld" and "beacon" in argv:
        assert "[beacon] milestones from each task's expert actions (its walkthrough)" in p.stdout
    assert json.load(open(tmp_path / "config.json"))["advantage"] == argv[3]


def test_the_readme_estimator_runs_as_one_file(tmp_path, monkeypatch):
    """README "Hack it": the RLOO block, written to a file, loads as --advantage my_adv:RLOO and computes by hand:
    group 0 rewards 1, 0, 0 -> 1 - 0 = 1, 0 - 1/2 = -0.5, -0.5; group 1 rewards 1, 1 -> 0, 0 (a group that teaches
    nothing); an error episode is out of its group."""
    import os
    import sys
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    block = readme.split("# my_adv.py")[1].split("```")[0]
    (tmp_path / "my_adv.py").write_text("# my_adv.py" + block)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("my_adv", None)
    from config import get_config
    from grpo import make_advantage
    cfg = get_config(["--advantage", "my_adv:RLOO"])
    est = make_advantage(cfg, [])
    eps = [{"eid": e, "gid": g, "reward": r, "error": err} for e, g, r, err in
           [("a", 0, 1.0, None), ("b", 0, 0.0, None), ("c", 0, 0.0, None), ("x", 0, 1.0, "boom"),
            ("d", 1, 1.0, None), ("e", 1, 1.0, None)]]
    rows = [{"eid": e} for e in "abcde"]
    assert est(rows, eps) == (1, 2)
    assert [r["adv"] for r in rows] == [1.0, -0.5, -0.5, 0.0, 0.0] and est.stats() == {}


def test_the_official_backend_flags_the_same_milestones(monkeypatch):
    """The official wrapper's detector (the server's product_item_dict / product_prices, WebShop's
    get_attribute_reward) against the fake web_agent_site (tests/fake_webshop): the scripted expert's winning
    episode reaches every milestone, as on lite."""
    import os
    import sys
    from plumbing import webshop
    from plumbing.webshop import WebShopEnv, scripted_expert
    fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_webshop")
    monkeypatch.syspath_prepend(fake)
    webshop._OFFICIAL_SERVER.clear()
    try:
        env = WebShopEnv({"env": "webshop", "backend": "official", "seed": 0, "products": 0, "path": fake,
                          "max_steps": 15, "setting": "authors", "milestones": True})
        walk, score = scripted_expert(env, 1500)
        assert score == 1.0
        ep, flags = env.reset(1500), []
        for a in walk:
            env.step(ep, a)
            flags.append(ep["milestone"])
        want = 4 if env.goals[1500]["goal_options"] else 3
        assert sum(flags) == want and flags[-1] and ep["phases"].phase == "complete", (walk, flags)
    finally:
        webshop._OFFICIAL_SERVER.clear()
        for m in [m for m in sys.modules if m.startswith("web_agent_site")]:
            del sys.modules[m]

"""plumbing/expert_data.py: the authors' expert data, read as their loader reads it, matched to games as they
match them; the hint sources (rollout.ExpertSource, variants/hints.py, README's one-file source)."""
import dataclasses
import json
import os

import pytest

from config import Config
from plumbing.tasks import load_tasks
from plumbing.expert_data import attach_expert_data, parse_target_key, read_expert_file, trial_aliases
from rollout import Hint


def trial(t):
    return os.path.basename(os.path.dirname(t["gamefile"]))


def write(path, entries):
    path.write_text(json.dumps({"trajectories": entries}))
    return str(path)


def test_entries_match_games_by_trial_and_the_rest_keep_their_walkthrough(tmp_path):
    """A hand-made file in the authors' format: entry ids are '<task folder>_<trial folder>' as theirs; the first
    matches game 0 by its trial_ tail, the second game 1 by a bare trial id; game 2 has none and keeps its
    walkthrough. The file's actions (a detour here) replace the walkthrough, its thinks ride along, and an action
    left empty is dropped with its think, as in their loader."""
    games = load_tasks("train", task_types=["pick_and_place_simple"])[:3]
    detour = ["go to shelf 1", " ", "go to shelf 2"] + games[0]["walkthrough"]
    path = write(tmp_path / "sft.json", [
        {"id": f"{games[0]['id'].split('/')[1]}_{trial(games[0])}", "task_type": "pick_and_place_simple",
         "actions": detour, "think": [f"t{j}" for j in range(len(detour))]},
        {"id": trial(games[1]), "actions": games[1]["walkthrough"]},  # no thinks
        {"id": "pick_and_place_simple-Mug-None-Desk-1_trial_T9999_99999_999", "actions": ["look"]},  # no such game
    ])
    entries = read_expert_file(path)
    assert entries[0]["actions"] == ["go to shelf 1", "go to shelf 2"] + games[0]["walkthrough"]
    assert entries[0]["thinks"] == ["t0", "t2"] + [f"t{j}" for j in range(3, len(detour))]  # t1 went with " "
    assert entries[1]["thinks"] == []
    tasks, note = attach_expert_data(games, entries, "alfworld")
    assert tasks[0]["walkthrough"] == entries[0]["actions"] and tasks[0]["L"] == len(games[0]["walkthrough"]) + 2
    assert tasks[0]["thinks"][:2] == ["t0", "t2"]
    assert tasks[1]["walkthrough"] == games[1]["walkthrough"] and tasks[1]["thinks"] == []
    assert tasks[2] == games[2] and "thinks" not in tasks[2]  # no entry: its own walkthrough
    assert note == "[hints] expert data: 2 of 3 training tasks matched; 1 keep their own walkthrough"
    assert trial_aliases("a-b_trial_T1_2") == ["a-b_trial_T1_2", "trial_T1_2"]


@pytest.mark.parametrize("entry, says", [
    ({"actions": ["look"]}, "entry 0: not an object with an \"id\""),
    ({"id": "x_trial_T1", "actions": "look"}, "entry 0 ('x_trial_T1'): \"actions\" must be a list of strings"),
    ({"id": "x_trial_T1", "actions": ["look"], "think": "why"}, "\"think\" must be a list of strings"),
    ({"id": "x_trial_T1", "actions": ["  "]}, "entry 0 ('x_trial_T1'): no action"),
])
def test_a_malformed_entry_is_a_clear_error_naming_it(tmp_path, entry, says):
    with pytest.raises(ValueError) as e:
        read_expert_file(write(tmp_path / "bad.json", [entry]))
    assert says in str(e.value) and str(tmp_path / "bad.json") in str(e.value)
    with pytest.raises(FileNotFoundError, match="xiamoent/Agent-G2-ALFWorld-Webshop-sft-data"):
        read_expert_file(str(tmp_path / "missing.json"))


def test_webshop_keys_as_the_authors_write_them():
    """'ASIN::value#count|...' (a value may hold '|'; values lower-cased, spaces collapsed), sorted like
    webshop.goal_target_key's (ASIN, sorted Counter of the option values)."""
    from plumbing.webshop import goal_target_key
    assert parse_target_key("b07wmmyb6g::#2 navy#1|30#1") == ("B07WMMYB6G", (("#2 navy", 1), ("30", 1)))
    assert parse_target_key("B01::a|b#1|Large  Size#2") == ("B01", (("a|b", 1), ("large size", 2)))
    assert parse_target_key("B01::") == ("B01", ()) and parse_target_key("no key") is None
    goal = {"asin": "b01", "goal_options": {"size": "Large  Size", "x": "large size", "c": "a|b"}}
    assert goal_target_key(goal) == parse_target_key("B01::a|b#1|Large  Size#2")


def test_train_py_reads_the_expert_file_for_training_tasks_only(tmp_path):
    """tasks.tasks_for with --expert_data: the training split gets the entries; an evaluation split (hint-free) is
    untouched."""
    from plumbing.tasks import tasks_for
    games = load_tasks("train", task_types=["pick_and_place_simple"])
    path = write(tmp_path / "sft.json", [{"id": trial(games[0]), "actions": ["look"] + games[0]["walkthrough"],
                                          "think": ["a"] * (games[0]["L"] + 1)}])
    c = dataclasses.replace(Config(), task_types="pick_and_place_simple", expert_data=path)
    train = tasks_for(c, "train")
    assert train[0]["walkthrough"] == ["look"] + games[0]["walkthrough"] and train[0]["thinks"][0] == "a"
    assert train[1:] == games[1:]
    assert tasks_for(c, "valid_seen") == load_tasks("valid_seen", task_types=["pick_and_place_simple"])


# ---- the hint sources
def episode(task_id, played, won=True, error=None):
    return {"task_id": task_id, "played": played, "won": won, "error": error}


def test_self_source_keeps_each_tasks_shortest_clean_win_and_survives_json():
    from variants.hints import SelfSource
    source = SelfSource()
    assert source.hint({"id": "a"}) is None
    assert source.observe([episode("a", ["x", "y", "z"], won=False), episode("b", ["p"], error="crash")]) == []
    assert source.observe([episode("a", ["x", "y", "z"]), episode("b", ["p", "q"])]) == ["a", "b"]
    assert source.observe([episode("a", ["x", "y", "z", "w"]), episode("a", ["x", "z"]),
                           episode("b", ["q", "p"])]) == ["a"]  # longer and equal wins change nothing
    assert source.hint({"id": "a"}) == Hint(["x", "z"], [])
    assert source.hint({"id": "b"}) == Hint(["p", "q"], [])
    restored = SelfSource()
    restored.load_state_dict(json.loads(json.dumps(source.state_dict())))
    assert restored.best == source.best


def test_self_and_mixed_combine_the_expert_and_the_policys_wins():
    """self: the expert's hint where there is one, else the policy's own win; mixed: the shorter of the two."""
    from rollout import ExpertSource
    from variants.hints import FirstOf, SelfSource, Shortest
    tasks = [{"id": "a", "walkthrough": ["1", "2", "3"], "thinks": ["t1", "t2", "t3"]},
             {"id": "b", "walkthrough": ["1", "2"]}]
    wins = [episode("a", ["9"]), episode("b", ["8", "7", "6"]), episode("c", ["5"])]
    self_hints, mixed = FirstOf(ExpertSource(tasks), SelfSource()), Shortest(ExpertSource(tasks), SelfSource())
    assert self_hints.hint({"id": "c"}) is None
    assert self_hints.observe(wins) == mixed.observe(wins) == ["a", "b", "c"]
    assert self_hints.hint({"id": "a"}) == Hint(["1", "2", "3"], ["t1", "t2", "t3"])
    assert self_hints.hint({"id": "c"}) == Hint(["5"], [])
    assert mixed.hint({"id": "a"}) == Hint(["9"], []) and mixed.hint({"id": "b"}) == Hint(["1", "2"], [])
    restored = Shortest(ExpertSource(tasks), SelfSource())
    restored.load_state_dict(json.loads(json.dumps(mixed.state_dict())))
    assert [restored.hint({"id": i}) for i in "abc"] == [mixed.hint({"id": i}) for i in "abc"]


def test_dropped_walkthroughs_are_a_fixed_share_and_the_same_for_every_run():
    """--drop_walkthroughs (variants/hints.py: --hint_source expert's variant path): a fixed, seeded share."""
    from rollout import group, make_hints
    from variants.hints import Dropped, dropped_ids
    tasks = [{"id": f"t{i:02d}", "walkthrough": ["go", "take"]} for i in range(40)]
    dropped = dropped_ids(tasks, 0.5)
    assert len(dropped) == 20 and dropped == dropped_ids(list(reversed(tasks)), 0.5)  # order-free
    assert set(dropped_ids(tasks, 0.25)) < set(dropped)  # one permutation: a smaller share is nested in it
    assert dropped_ids(tasks, 0.0) == [] and len(dropped_ids(tasks, 1.0)) == 40
    source = make_hints(dataclasses.replace(Config(), drop_walkthroughs=0.5), tasks)
    assert type(source) is Dropped
    assert [source.hint(t) is None for t in tasks] == [t["id"] in dropped for t in tasks]
    kept = next(t for t in tasks if t["id"] not in dropped)
    assert group(kept, source.hint(kept), 1, 2) == {"task": kept, "n": 1, "R": 2, "prefix": ["go"],
                                                    "thinks": [], "text": ""}
    unhinted = next(t for t in tasks if t["id"] in dropped)
    assert group(unhinted, source.hint(unhinted), 0, 2)["prefix"] == []
    with pytest.raises(ValueError, match="a prefix of 1 steps, but its hint has 0"):
        group(unhinted, source.hint(unhinted), 1, 2)
    for name in ("self", "mixed"):  # the policy's own wins beside the same expert hints
        both = make_hints(dataclasses.replace(Config(), hint_source=name, drop_walkthroughs=0.5), tasks)
        assert [both.hint(t) is None for t in tasks] == [t["id"] in dropped for t in tasks]


def test_make_hints_builds_the_source_the_config_names():
    """The paper's expert source in the core; self, mixed and a dropped share through config.variant."""
    from rollout import ExpertSource, make_hints
    from variants.hints import Dropped, MixedHints, SelfHints
    tasks = [{"id": "a", "walkthrough": ["go", "take"], "thinks": ["g", "t"]}, {"id": "b", "walkthrough": []}]
    for flags, cls in (({}, ExpertSource), ({"hint_source": "self"}, SelfHints),
                       ({"hint_source": "mixed"}, MixedHints), ({"drop_walkthroughs": 0.5}, Dropped)):
        assert type(make_hints(dataclasses.replace(Config(), **flags), tasks)) is cls, flags
    expert = make_hints(Config(), tasks)
    assert expert.hint(tasks[0]) == Hint(["go", "take"], ["g", "t"], "") and expert.hint(tasks[1]) is None
    assert expert.observe([episode("b", ["go"])]) == [] and expert.state_dict() == {}


def test_games_without_a_walkthrough_are_kept_for_a_self_source_and_refused_otherwise(tmp_path, monkeypatch):
    import shutil
    from plumbing.tasks import tasks_for
    src = load_tasks("train", task_types=["pick_and_place_simple"])[:3]
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    for i, t in enumerate(src):
        dst = tmp_path / "json_2.1.1" / "train" / t["id"].split("/", 1)[1]
        shutil.copytree(os.path.dirname(t["gamefile"]), dst)
        if i == 1:
            game = json.load(open(dst / "game.tw-pddl"))
            del game["walkthrough"]
            json.dump(game, open(dst / "game.tw-pddl", "w"))
    with pytest.raises(ValueError, match="1 games without a walkthrough.*--hint_source self or mixed"):
        tasks_for(dataclasses.replace(Config(), games="official"), "train")
    for hint_source in ("self", "mixed"):
        got = tasks_for(dataclasses.replace(Config(), games="official", hint_source=hint_source), "train")
        assert [t["walkthrough"] for t in got] == [src[0]["walkthrough"], [], src[2]["walkthrough"]]
        assert [t["L"] for t in got] == [src[0]["L"], 0, src[2]["L"]]


def test_the_readme_hint_source_runs_as_one_file_and_its_text_reaches_the_prompt(tmp_path, monkeypatch,
                                                                                   capsys):
    """README "Hack it": the hint-source block, written to its own file and selected with --hint_source
    my_hints:FirstStop (the class its first line names), is all a new source takes: rollout.make_hints builds
    it through config.variant; its hint replays nothing, and its text is the line after the task in every
    prompt of a rollout group ("Hint: first go to sinkbasin 1", as the README says), while the same task
    without it shows no such line; it learns from wins and survives a checkpoint; a malformed one is a
    one-line error at config time."""
    import re
    import sys
    from transformers import AutoTokenizer
    from config import get_config
    from envs import EnvPool
    from plumbing.tiny import tiny_path
    from rollout import group, make_hints, rollout
    from test_rollout import Recorder  # the engine's test double: replies 'look' to every prompt
    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if b.startswith("# my_hints.py"))
    name = re.match(r"# my_hints.py .*--hint_source (my_hints:\w+)", block).group(1)
    (tmp_path / "my_hints.py").write_text(block)
    (tmp_path / "bad_hints.py").write_text("class NoObserve:\n    def hint(self, task):\n        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = get_config(["--hint_source", name, "--prompt", "full", "--max_steps", "3"])
    tasks = load_tasks("train")
    source = make_hints(cfg, tasks)
    assert type(source).__name__ == name.split(":")[1]
    first_stop = {t["id"]: next(a for a in t["walkthrough"] if a.startswith("go to ")) for t in tasks}
    t = next(t for t in tasks if first_stop[t["id"]] == "go to sinkbasin 1")
    hint = source.hint(t)
    assert hint == Hint([], [], "first go to sinkbasin 1")  # a text, nothing to replay
    assert group(t, hint, 0, 2)["prefix"] == [] and group(t, hint, 0, 2)["text"] == "first go to sinkbasin 1"
    with pytest.raises(ValueError, match="a prefix of 1 steps, but its hint has 0"):
        group(t, hint, 1, 2)
    (tmp_path / "tiny").mkdir()
    tok = AutoTokenizer.from_pretrained(tiny_path(str(tmp_path / "tiny")))
    pool = EnvPool(1)
    try:
        out = rollout(Recorder(tok), pool, tok, [group(t, hint, 0, 2), group(t, None, 0, 1)], cfg)
    finally:
        pool.close()
    hinted = [tok.decode(r["prompt_ids"]) for r in out["rows"] if r["gid"] == 0]
    plain = [tok.decode(r["prompt_ids"]) for r in out["rows"] if r["gid"] == 1]
    assert len(hinted) == 2 * 3 and len(plain) == 3
    for prompt in hinted:
        lines = prompt.splitlines()
        task_line = next(j for j, x in enumerate(lines) if "Your task is to:" in x)
        assert lines[task_line + 1] == "Hint: first go to sinkbasin 1"
    assert not any("Hint:" in p for p in plain)
    assert hinted[0].replace("Hint: first go to sinkbasin 1\n", "") == plain[0]  # the same, less the line
    assert source.observe([episode(t["id"], ["look"])]) == [t["id"]]  # won once: no hint any more
    assert source.hint(t) is None
    assert source.observe([episode(t["id"], ["look"])]) == []  # the same win again: no change
    restored = make_hints(cfg, tasks)
    restored.load_state_dict(json.loads(json.dumps(source.state_dict())))
    assert [restored.hint(x) for x in tasks[:20] + [t]] == [source.hint(x) for x in tasks[:20] + [t]]
    with pytest.raises(SystemExit):
        get_config(["--hint_source", "bad_hints:NoObserve"])
    # the first method it lacks, with the signature the code calls it by (plumbing/plugins.py)
    assert "NoObserve has no method observe; it must be NoObserve.observe(self, episodes)" in capsys.readouterr().err
    sys.modules.pop("my_hints", None)
    sys.modules.pop("bad_hints", None)


@pytest.mark.slow
def test_text_hints_are_counted_at_start_up_and_logged(tmp_path):
    """A source whose hints are text alone (README's FirstStop): train.py's start-up line counts them apart from
    the hints to replay, and each step's record says how many tasks of the batch carry one (text_hints)."""
    import re
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md")).read()
    (tmp_path / "my_hints.py").write_text(
        next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if b.startswith("# my_hints.py")))
    p = subprocess.run([sys.executable, "train.py", "--hint_source", "my_hints:FirstStop", "--steps", "1",
                        "--batch_tasks", "4", "--group_size", "2", "--max_steps", "3", "--eval_games", "-1",
                        "--train_panel", "0", "--num_workers", "1", "--engine", "hf", "--ckpt_every", "0",
                        "--out_dir", str(tmp_path / "run")], cwd=root, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(tmp_path), "TQDM_DISABLE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    n = len(load_tasks("train", task_types=["pick_and_place_simple", "look_at_obj_in_light"]))
    assert f"[hints] my_hints:FirstStop: 0 of {n} training tasks start with a hint to replay, {n} with a text" \
        in p.stdout
    rec = json.loads(open(tmp_path / "run" / "log.jsonl").readlines()[0])
    assert rec["hinted"] == 0 and rec["text_hints"] == 4

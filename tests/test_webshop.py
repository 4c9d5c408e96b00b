"""WebShop: the lite backend (our own site over a generated catalogue) and the official wrapper's contract,
checked against a fake `web_agent_site` that follows the documented interface (tests/fake_webshop/), and
against a real checkout when one is importable ($WEBSHOP_PATH)."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from plumbing import webshop
from tools import webshop_doctor
from envs import EnvPool
from plumbing.webshop import (SEARCH_ACTION, WEBSHOP_SPLITS, WebShopEnv, load_webshop_tasks, make_catalogue,
                              parse_webshop_action, scripted_expert, webshop_reward)

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_webshop")
LITE = {"env": "webshop", "backend": "lite", "seed": 0, "products": 520, "max_steps": 15}  # 1650 goals


@pytest.fixture(scope="module")
def lite():
    return WebShopEnv(LITE)


def test_scripted_expert_reaches_reward_1_on_every_goal_of_a_split(lite):
    for i in range(*WEBSHOP_SPLITS["test"]):
        walk, score = scripted_expert(lite, i)
        assert score == 1.0 and walk[0].startswith("search[") and walk[-1] == "click[buy now]", i
    train = load_webshop_tasks("train", LITE)
    assert [t["gamefile"] for t in train] == list(range(1500, len(lite.goals)))  # every train goal has hints
    for t in train[:100]:
        ep = lite.reset(t["gamefile"], t["walkthrough"][:-1])  # the expert prefix replays, then the last step
        assert lite.step(ep, t["walkthrough"][-1]) and ep["score"] == 1.0 and ep["won"] and ep["done"]
    evals = load_webshop_tasks("valid_unseen", LITE)  # ALFWorld's name means WebShop's eval range
    assert [t["gamefile"] for t in evals] == list(range(500, 1500))


def test_split_schemes_paper_and_authors():
    """paper: WebShop's ranges. authors [ZJU-REAL/Agent-G2 webshop/envs.py]: validation = the first 500 goals
    after dropping repeated (ASIN, options) keys, train = 500+. Here goal 2k+1 repeats goal 2k's key (same ASIN in
    another case, same option values in another case and spacing), so the authors' validation is 0, 2, ..., 998."""
    goals = []
    for i in range(1200):
        opts = {"size": "12 pack", "color": "Navy Blue"} if i % 2 == 0 else {"color": "navy  blue", "size": "12 Pack"}
        goals.append({"asin": f"b{i // 2:09d}" if i % 2 else f"B{i // 2:09d}", "goal_options": opts})
    assert webshop.webshop_split_indices(goals, "test", "paper") == list(range(500))
    assert webshop.webshop_split_indices(goals, "eval", "paper") == list(range(500, 1200))
    assert webshop.webshop_split_indices(goals, "train", "paper") == []
    assert webshop.webshop_split_indices(goals, "eval", "authors") == list(range(0, 1000, 2))
    assert webshop.webshop_split_indices(goals, "test", "authors") == list(range(0, 1000, 2))
    assert webshop.webshop_split_indices(goals, "train", "authors") == list(range(500, 1200))
    assert webshop.goal_target_key(goals[0]) == ("B000000000", (("12 pack", 1), ("navy blue", 1)))
    # through load_webshop_tasks on lite (whose goals never repeat a key): the authors' train starts at 500
    spec = dict(LITE, split="authors")
    assert [t["gamefile"] for t in load_webshop_tasks("train", spec, only=range(495, 505))] == list(range(500, 505))
    assert [t["gamefile"] for t in load_webshop_tasks("valid_unseen", spec)] == list(range(500))


def test_random_actions_score_about_zero_and_never_crash(lite):
    rng = np.random.default_rng(0)
    words = sorted({w for g in lite.goals for w in g["instruction_text"].split()})
    scores = []
    for i in range(200):
        ep = lite.reset(i)
        for _ in range(15):
            a = ep["admissible"][rng.integers(len(ep["admissible"]))] if ep["admissible"] else "click[buy now]"
            lite.step(ep, f"search[{' '.join(rng.choice(words, 3))}]" if a == SEARCH_ACTION else a)
        scores.append(ep["score"])
    assert np.mean(scores) < 0.1 and sum(s == 1.0 for s in scores) <= 2


@pytest.mark.parametrize("action", ["", None, "buy", "click[]", "search[]", "click[no such thing]", "click[search]",
                                    "click[buy now]", "Search [mug]", "search[mug", 42])
def test_malformed_and_out_of_page_actions_are_invalid_steps(lite, action):
    ep = lite.reset(3)
    page = ep["obs"]
    assert lite.step(ep, action) is False
    assert ep["obs"] == "Invalid action. " + page and ep["steps"] == 1 and not ep["done"]
    assert lite.step(ep, "search[red mug]")  # the page was left as it was
    assert not lite.step(ep, "click[buy now]")  # nothing to buy on a results page


def test_parse_webshop_action():
    assert parse_webshop_action("search[Red  Mug ]") == ("search", "red mug")
    assert parse_webshop_action("click[Buy Now]") == ("click", "buy now")
    assert parse_webshop_action("click[ ]") is None and parse_webshop_action("look") is None


def test_brackets_leave_queries_and_are_never_admissible():
    """WebShop's parse_action (engine.py) matches '(.+)\\[(.+)\\]' greedily from the start, so 'search[red [mug]]'
    is the action 'search[red ' and does nothing: queries lose their brackets, bracketed values are not offered."""
    assert parse_webshop_action("search[red [mug]]") == ("search", "red mug")
    assert parse_webshop_action("search[[Red] mug]") == ("search", "red mug")
    assert parse_webshop_action("search[[ ]]") is None  # nothing left
    assert webshop.webshop_admissible(False, ["back to search", "2 [pack]", "buy now"]) == \
        ["click[back to search]", "click[buy now]"]
    site = webshop.LiteSite(9, 60)  # its own site: the option injected below must not leak into the cached one
    env = WebShopEnv(dict(LITE, seed=9, products=60))
    env.site = site
    walk, _ = scripted_expert(env, 0)
    site.products[env.goals[0]["asin"]]["options"]["size"] = ["small", "2 [pack]"]
    ep = env.reset(0, walk[:2])  # on the target's item page
    assert "click[small]" in ep["admissible"] and not any("[pack]" in a for a in ep["admissible"])
    assert env.step(ep, "click[2 [pack]]") is False


SPECIAL = ["search[<a> cotton]", "search[<q> t-shirt]", "search[<c> fashion]", "search[<r>]", "search[<A> Cotton]",
           "search[ <r>  mug]"]


@pytest.mark.parametrize("action", SPECIAL)
def test_special_search_words_are_invalid_on_lite(lite, action):
    """WebShop's engine.py (get_top_n_product_from_keywords) takes a first word <a>/<q>/<c>/<r> as a command."""
    ep = lite.reset(3)
    page = ep["obs"]
    assert lite.step(ep, action) is False and ep["obs"] == "Invalid action. " + page


def test_search_from_any_page_on_lite(lite):
    """WebShop's step searches from any page (web_agent_text_env.py); the admissible list still offers search
    only where the page has a search bar."""
    walk, _ = scripted_expert(lite, 5)
    for n in (1, 2):  # a results page, the item page
        ep = lite.reset(5, walk[:n])
        assert webshop.SEARCH_ACTION not in ep["admissible"]
        assert lite.step(ep, "search[organic green tea]")
        assert ep["obs"].startswith("Back to Search [SEP] Page 1 (Total results: ") and ep["page"]["page"] == 1
        assert ep["page"]["results"] == lite.site.search("organic green tea")


def test_same_seed_same_catalogue_goals_and_rewards():
    a, b, c = make_catalogue(5, 120), make_catalogue(5, 120), make_catalogue(6, 120)
    assert a == b and a != c
    webshop.lite_site.cache_clear()
    spec = dict(LITE, seed=5, products=120)
    e1, e2 = WebShopEnv(spec), webshop.LiteSite(5, 120)
    assert e1.site.search("organic green tea") == e2.search("organic green tea")
    walks = [scripted_expert(e1, i) for i in range(20)]
    assert walks == [scripted_expert(e1, i) for i in range(20)]


PRODUCT = {"Title": "Acme Classic Cotton T-Shirt", "BulletPoints": ["Machine wash."], "Description": "A soft tee.",
           "Attributes": ["cotton"], "price": 18.0, "query": "t-shirt",
           "product_category": "Clothing › Men › T-Shirts"}
GOAL = {"attributes": ["cotton", "machine wash"], "goal_options": {"color": "navy blue", "size": "large"},
        "price_upper": 20.0, "query": "t-shirt", "name": "Acme Classic Cotton T-Shirt",
        "product_category": "Clothing › Men › T-Shirts"}


def test_reward_terms_by_hand():
    r, i = webshop_reward(GOAL, PRODUCT, ["navy blue", "large"])  # everything matches
    assert r == 1.0 and (i["r_att"], i["r_option"], i["r_price"], i["r_type"]) == (2, 2, 1.0, 1.0)
    # attributes: 'machine wash' only in the bullets counts; 'slim fit' is nowhere -> 1 of 2
    r, i = webshop_reward({**GOAL, "attributes": ["cotton", "slim fit"]}, PRODUCT, ["navy blue", "large"])
    assert i["r_att"] == 1 and r == pytest.approx((1 + 2 + 1) / (2 + 2 + 1))
    # options: one of two chosen right; 'dark navy' normalises to the colour 'navy', like 'navy blue'
    r, i = webshop_reward(GOAL, PRODUCT, ["dark navy", "small"])
    assert i["r_option"] == 1 and r == pytest.approx((2 + 1 + 1) / 5)
    # price: over the cap -> that term is 0
    r, i = webshop_reward(GOAL, {**PRODUCT, "price": 25.0}, ["navy blue", "large"])
    assert i["r_price"] == 0 and r == pytest.approx(4 / 5)
    # type: other query and category; title nouns overlap 1 of 4 (>0.2) -> still 1.0; 1 of 11 -> 0.1; none -> 0
    other = {**PRODUCT, "query": "hoodie", "product_category": "Sports › Outdoor › Gear"}
    assert webshop_reward(GOAL, {**other, "Title": "Zephyr Hoodie Cotton"}, ["navy blue", "large"])[1]["r_type"] == 1.0
    long_name = {**GOAL, "name": "acme classic cotton shirt alpha bravo charlie delta echo foxtrot golf"}
    r, i = webshop_reward(long_name, {**other, "Title": "Zephyr Cotton Hoodie"}, ["navy blue", "large"])
    assert i["title_score"] == pytest.approx(1 / 11) and i["r_type"] == 0.1 and r == pytest.approx(0.1)
    r, i = webshop_reward(GOAL, {**other, "Title": "Zephyr Hoodie"}, ["navy blue", "large"])
    assert i["title_score"] == 0 and r == 0.0
    medium = {**GOAL, "name": "acme classic cotton shirt alpha bravo"}  # 1 of 6 nouns: 0.1 <= score <= 0.2 -> 0.5
    assert webshop_reward(medium, {**other, "Title": "Zephyr Cotton Hoodie"}, ["navy blue", "large"])[1]["r_type"] == 0.5


@pytest.mark.parametrize("want,got", [("12 pack", "24 pack"), ("24 pack", "12 pack"), ("2 ounce", "8 ounce"),
                                      ("8 ounce", "2 ounce"), ("large", "x-large")])
def test_lite_reward_a_wrong_size_never_wins(want, got):
    """Lite's goals are synthetic, so options are scored as WebShop scores synthetic goals (goal.py get_reward
    passes goal_options.items()): the pair ('size', v) as the text 'size v', thefuzz's rounded score > 85. By
    value alone '24 pack' vs '12 pack' scores 86 (sorted tokens 'pack 24' / 'pack 12': 2*6/14 = 85.7) and
    'x-large' contains 'large' (100); as pairs the best is 73 ('pack' / 'pack 24': 8/11), 83 ('ounce' /
    'ounce 2': 10/12) and 83 ('large' / 'large x': 10/12). GOAL's 2 attributes and price match, type 1.0, so a
    wrong size gives (2 + 0 + 1) / (2 + 1 + 1) = 0.75 and the right one 1.0."""
    goal = {**GOAL, "goal_options": {"size": want}}
    r, i = webshop_reward(goal, PRODUCT, [got])
    assert i["r_option"] == 0 and r == pytest.approx(0.75)
    assert webshop_reward(goal, PRODUCT, [want])[0] == 1.0
    assert webshop.fuzzy_ratio("24 pack", "size 12 pack") == 73 and webshop.fuzzy_ratio("2 ounce", "size 8 ounce") == 83
    assert webshop.fuzzy_ratio("x-large", "size large") == 83


def test_lite_catalogue_has_no_wrong_option_that_wins():
    """Every option list of the generated catalogue: choosing any other value of the list scores 0 for that
    option. ('x-large' became 'xl': as pairs a goal ('size', 'x-large') is still fully met by 'large', whose
    one token is inside 'size x large'.)"""
    products, _, _ = make_catalogue(0, 200)
    lists = {(k, tuple(v["value"] for v in vals))
             for p in products for k, vals in (p["customization_options"] or {}).items()}
    assert len(lists) > 20
    for name, vals in lists:
        for want in vals:
            for got in vals:
                r_option = webshop_reward({**GOAL, "goal_options": {name: want}}, PRODUCT, [got])[1]["r_option"]
                assert r_option == (got == want), (name, want, got)


def test_normalize_color_follows_webshops_substring_order():
    """WebShop's normalize.py returns the first word of an alphabetical colour list found as a substring."""
    assert webshop.normalize_color("navy blue") == "blue" and webshop.normalize_color("olive green") == "green"
    assert webshop.normalize_color("dark grey") == "grey" and webshop.normalize_color("6 pack") == "6 pack"


def _item_page(env, i):
    walk, _ = scripted_expert(env, i)
    k = walk.index(f"click[{env.goals[i]['asin'].lower()}]")
    return env.reset(i, walk[:k + 1]), walk[k + 1:-1]


def test_lite_pages_read_like_webshops_text_mode(lite):
    """templates/results_page.html shows 'Next >' on every results page; item_page.html renders options before
    the title with no mark on the chosen one, and get_available_actions lists the buttons before the option
    values; review_page.html has no reviews to show (the text env loads none); prices read as load_products
    writes them ('$' + the float, or '$a to $b' for a range)."""
    assert webshop.price_tag("$12.50 - $15.99") == "$12.5 to $15.99" and webshop.price_tag("$18.00") == "$18.0"
    assert webshop.price_tag("") == "$100.0"
    ep = lite.reset(0)
    assert lite.step(ep, "search[organic green tea]")
    n, last = len(ep["page"]["results"]), -(-len(ep["page"]["results"]) // 10)
    assert ep["obs"].startswith(f"Back to Search [SEP] Page 1 (Total results: {n}) [SEP] Next > [SEP] ")
    for _ in range(last - 1):
        assert lite.step(ep, "click[next >]")
    assert ep["obs"].startswith(f"Back to Search [SEP] Page {last} (Total results: {n}) [SEP] < Prev [SEP] Next > ")
    assert ep["admissible"][:3] == ["click[back to search]", "click[< prev]", "click[next >]"]  # on the last page
    i = next(i for i, g in enumerate(lite.goals) if len(g["goal_options"]) == 2)
    ep, opts = _item_page(lite, i)
    q = lite.site.products[lite.goals[i]["asin"]]
    values = [v for vals in q["options"].values() for v in vals]
    assert ep["clickables"] == ["back to search", "< prev", "description", "features", "reviews", "buy now"] + values
    for a in opts:
        assert lite.step(ep, a)
    shown = " [SEP] ".join(x for k, vals in q["options"].items() for x in [k] + vals)  # name, its values, ...
    assert "[clicked]" not in ep["obs"] and ep["obs"].startswith(f"Back to Search [SEP] < Prev [SEP] {shown} [SEP] "
                                                                 f"{q['Title']} [SEP] Price: {q['Price']} [SEP] ")
    assert lite.step(ep, "click[reviews]") and ep["obs"] == "Back to Search [SEP] < Prev"
    ranged = next(p for p in lite.site.products.values() if " to $" in p["Price"])
    lo, hi = (float(x) for x in ranged["Price"].replace("$", "").split(" to "))
    assert lo < ranged["price"] < hi  # the hidden price the reward uses


# ---------------------------------------------------------------------------------------------
# the official backend's wrapper, against the fake (always) and a real checkout (when importable)
# ---------------------------------------------------------------------------------------------
def _official_path(kind):
    if kind == "fake":
        return FAKE
    path = os.environ.get("WEBSHOP_PATH", "")
    if not os.path.isdir(os.path.join(path, "web_agent_site")) and importlib.util.find_spec("web_agent_site") is None:
        reason = "no real web_agent_site importable (set WEBSHOP_PATH to a princeton-nlp/WebShop checkout)"
        print(f"[test_webshop] skipped the real-WebShop contract run: {reason}")
        pytest.skip(reason)
    return path


@pytest.fixture(params=[("fake", "authors"), ("fake", "human"), ("real", "authors"), ("real", "human")],
                ids=lambda p: "-".join(p))
def official(request):
    kind, setting = request.param
    path = _official_path(kind)
    sys.path.insert(0, path)
    webshop._OFFICIAL_SERVER.clear()
    yield {"env": "webshop", "backend": "official", "seed": 0, "products": 0, "path": path, "max_steps": 6,
           "setting": setting}
    sys.path.remove(path)
    webshop._OFFICIAL_SERVER.clear()
    for m in [m for m in sys.modules if m.startswith("web_agent_site")]:
        del sys.modules[m]


def test_official_wrapper_contract(official, tmp_path):
    import random
    env = WebShopEnv(official)
    n = len(env.goals)
    assert n > 1500, "the contract needs goals in all three ranges"
    # the setting: the authors' synthetic goals (dict options, one per product x option combination) from their
    # 1,000-product file, or WebShop's human goals (list options) from the catalogue utils.py names
    human = official["setting"] == "human"
    assert all(isinstance(g["goal_options"], list if human else dict) for g in env.goals)
    assert getattr(env.env, "file_path", None) == (None if human else os.path.join(official["path"],
                                                                                  webshop.AUTHORS_PRODUCTS)) \
        or official["path"] != FAKE
    # split indexing: the paper's goal-index ranges into the server's goal list; evaluation keeps every goal
    assert [t["gamefile"] for t in load_webshop_tasks("test", official, cache=str(tmp_path))] == list(range(500))
    assert [t["gamefile"] for t in load_webshop_tasks("eval", official, cache=str(tmp_path))] == list(range(500, 1500))
    # the train split through the scripted expert, on a seeded sample (a real install has ~10k train goals)
    sample = sorted(random.Random(0).sample(range(1500, n), min(60, n - 1500)))
    train = load_webshop_tasks("train", official, cache=str(tmp_path), only=sample)
    assert len(train) >= 0.9 * len(sample) and all(t["gamefile"] in sample and t["L"] >= 3 for t in train)
    assert len(os.listdir(tmp_path)) == 1  # the expert walks are cached (failures too) for the next launch
    assert [t["walkthrough"] for t in load_webshop_tasks("train", official, cache=str(tmp_path), only=sample)] == \
        [t["walkthrough"] for t in train]
    t = train[0]
    walk = t["walkthrough"]
    k = walk.index(f"click[{env.goals[t['gamefile']]['asin'].lower()}]")  # the target may sit past results page 1
    ep = env.reset(t["gamefile"])
    assert ep["task"] == env.goals[t["gamefile"]]["instruction_text"] and ep["admissible"] == [SEARCH_ACTION]
    assert "Instruction:" not in ep["obs"]  # the instruction is the task, not part of the observation
    # reward mapping: the expert's buy -> raw reward 1 -> won; a wrong buy -> the raw reward, not won
    ep = env.reset(t["gamefile"], walk[:-1])
    assert env.step(ep, walk[-1]) and ep["score"] == 1.0 and ep["won"]
    ep = env.reset(t["gamefile"], walk[:k + 1])  # on the item page, no option chosen
    assert env.step(ep, "click[buy now]") and 0.0 <= ep["score"] < 1.0 and not ep["won"] and ep["done"]
    if hasattr(env.env, "last_reward"):
        assert ep["score"] == env.env.last_reward
    # R rollouts of one goal run side by side in one process: each keeps its own page (own session)
    other = WebShopEnv(official)
    ep1 = env.reset(t["gamefile"], walk[:-1])  # on the item page, options chosen
    ep2 = other.reset(t["gamefile"], walk[:k])  # the same goal, on the results page that lists the target
    assert env.step(ep1, "click[buy now]") and ep1["score"] == 1.0
    assert other.step(ep2, walk[k]) and "Buy Now" in ep2["obs"]
    # step limit: max_steps (6) counted steps, then every action is refused
    ep = env.reset(t["gamefile"])
    assert env.step(ep, "search[anything]")
    for _ in range(5):
        env.step(ep, "click[< prev]" if "click[< prev]" in ep["admissible"] else "click[next >]")
    assert not env.step(ep, "click[back to search]") and ep["steps"] == 7
    # every worker process sees the same goal for the same index (price caps come from the global `random`,
    # which the wrapper seeds before the server is built; unseeded, the workers' instructions would differ)
    pool = EnvPool(2, official)
    try:
        a = pool.run([("reset", 1, 3, []), ("reset", 2, 7, [])])  # goal 7 -> worker 1
        b = pool.run([("reset", 3, 7, []), ("reset", 4, 9, [])])  # goal 7 -> worker 0
        assert a[1]["ok"] and b[0]["ok"] and a[1]["task"] == b[0]["task"] == env.goals[7]["instruction_text"]
    finally:
        pool.close()


def test_official_special_words_brackets_any_page_search(official):
    """Items 1-3 on the official backend: the fake does what WebShop does (<a> raises a TypeError, a bracketed
    query is a no-op, search works from any page), so only the wrapper can make these right."""
    env = WebShopEnv(official)
    for a in SPECIAL:
        ep = env.reset(3)
        page = ep["obs"]
        assert env.step(ep, a) is False and ep["obs"] == "Invalid action. " + page, a
    ep = env.reset(3)
    assert env.step(ep, "search[[green] tea]") and "Page 1 (Total results: " in ep["obs"]
    first = next(c for c in ep["clickables"] if c not in ("back to search", "next >", "< prev"))  # a product
    assert env.step(ep, f"click[{first}]")  # on its item page: no search bar
    assert webshop.SEARCH_ACTION not in ep["admissible"] and "Buy Now" in ep["obs"]
    assert env.step(ep, "search[green tea]") and "Page 1 (Total results: " in ep["obs"]


def test_official_reset_with_a_numpy_index_plays_that_goal(official):
    """WebShop's reset / SimServer.receive take the goal index only from a Python int; anything else -> random."""
    env = WebShopEnv(official)
    ep = env.reset(np.int64(7))
    assert env.env.server.user_sessions[env.env.session]["goal"] is env.goals[7]
    assert ep["task"] == env.goals[7]["instruction_text"] and ep["goal_index"] == 7


def test_webshop_doctor_names_what_is_missing(tmp_path):
    run = lambda p: subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "envs.py"),  # noqa: E731
                                    "webshop-doctor"], env={**os.environ, "WEBSHOP_PATH": p}, capture_output=True,
                                   text=True, timeout=60)
    r = run(str(tmp_path))
    assert r.returncode == 1 and "holds no web_agent_site" in r.stdout
    r = run(FAKE)  # a checkout without data, index or model (its utils.py keeps WebShop's 1000-product defaults)
    assert r.returncode == 1
    for what in ("data/items_shuffle_1000.json", "data/items_human_ins.json", "search_engine/indexes",
                 "en_core_web_sm", "pyserini", "Java"):
        assert what in r.stdout
    assert "[MISSING] utils.py DEFAULT_ATTR_PATH -> data/items_ins_v2_1000.json" in r.stdout


# A WebShop layout in tmp_path. utils.py as WebShop's README says to edit it for the full set: the 1000-product
# lines left commented above the full ones. Five products; the raw file also holds a repeat and a 'nan' ASIN,
# which WebShop's load_products skips, so 5 remain (and the index, built from them, has 5 documents).
README_UTILS = """from os.path import dirname, abspath, join
BASE_DIR = dirname(abspath(__file__))
# DEFAULT_ATTR_PATH = join(BASE_DIR, '../data/items_ins_v2_1000.json')
# DEFAULT_FILE_PATH = join(BASE_DIR, '../data/items_shuffle_1000.json')
DEFAULT_ATTR_PATH = join(BASE_DIR, '../data/items_ins_v2.json')
DEFAULT_FILE_PATH = join(BASE_DIR, '../data/items_shuffle.json')
DEFAULT_REVIEW_PATH = join(BASE_DIR, '../data/reviews.json')
HUMAN_ATTR_PATH = join(BASE_DIR, '../data/items_human_ins.json')
"""
ASINS = ["B000000001", "B000000002", "B000000003", "B000000004", "B000000005"]


def _layout(root, utils=README_UTILS, docs=5, attrs_1000=None):
    (root / "web_agent_site").mkdir(parents=True)
    (root / "web_agent_site" / "utils.py").write_text(utils)
    (root / "data").mkdir()
    raw = [{"asin": a, "name": f"thing {a}", "small_description": ["x [y] {z}"]} for a in ASINS]
    raw.insert(2, dict(raw[0]))  # a repeat
    raw.append({"asin": "nan", "name": "no asin"})
    (root / "data" / "items_shuffle.json").write_text(json.dumps(raw, indent=2))
    (root / "data" / "items_ins_v2.json").write_text(json.dumps({a: {"attributes": ["cotton"]} for a in ASINS}))
    if attrs_1000 is not None:  # the preview's attribute file: only its first products
        (root / "data" / "items_ins_v2_1000.json").write_text(
            json.dumps({a: {"attributes": ["cotton"]} for a in ASINS[:attrs_1000]}))
    (root / "data" / "items_human_ins.json").write_text(json.dumps({ASINS[0]: []}))
    (root / "search_engine" / "resources").mkdir(parents=True)
    (root / "search_engine" / "resources" / "documents.jsonl").write_text("{}\n" * docs)
    (root / "search_engine" / "indexes").mkdir()
    (root / "search_engine" / "indexes" / "segments_1").write_text("")
    return str(root)


def _doctor(tmp_path, checkout, setting="human"):
    """The CLI for one setting, with the Python side (spaCy model, pyserini 0.17.0) and Java 11 faked in tmp_path."""
    site, bin_ = tmp_path / "site", tmp_path / "bin"
    (site / "en_core_web_sm").mkdir(parents=True, exist_ok=True)
    (site / "en_core_web_sm" / "__init__.py").write_text("")
    (site / "pyserini-0.17.0.dist-info").mkdir(exist_ok=True)
    (site / "pyserini-0.17.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pyserini\n"
                                                                  "Version: 0.17.0\n")
    bin_.mkdir(exist_ok=True)
    (bin_ / "java").write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    (bin_ / "java").chmod(0o755)
    env = {**os.environ, "WEBSHOP_PATH": checkout, "PYTHONPATH": str(site),
           "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "envs.py"), "webshop-doctor",
                           "--setting", setting], env=env, capture_output=True, text=True, timeout=60)


def test_webshop_doctor_passes_a_correct_full_install(tmp_path):
    """setup.sh -d all fetches items_shuffle.json and items_ins_v2.json, no *_1000 files; utils.py edited as in
    WebShop's README (commented lines first); the index counts the deduplicated products (5, not the raw 7)."""
    r = _doctor(tmp_path, _layout(tmp_path / "WebShop"))
    assert r.returncode == 0, r.stdout
    assert "[ok] utils.py DEFAULT_FILE_PATH -> data/items_shuffle.json" in r.stdout
    assert "[ok] utils.py DEFAULT_ATTR_PATH -> data/items_ins_v2.json" in r.stdout
    assert "[ok] 5 products after WebShop's deduplication in data/items_shuffle.json" in r.stdout
    assert "[ok] attributes for 5 of 5 products" in r.stdout
    assert "[ok] index documents 5 vs deduplicated products 5" in r.stdout
    assert "_1000" not in r.stdout


def test_webshop_doctor_checks_the_authors_setting_files(tmp_path):
    """The authors' setting reads data/items_shuffle_1000.json (the wrapper passes it), whatever utils.py's
    DEFAULT_FILE_PATH says, and its index must hold those products: the full install above lacks the file; with it
    (3 products) and a 3-document index the setting is ready, and the full set's 5-document index is named stale."""
    checkout = _layout(tmp_path / "WebShop", docs=3)
    r = _doctor(tmp_path, checkout, "authors")
    assert r.returncode == 1 and "[MISSING] data/items_shuffle_1000.json (the 1,000 products" in r.stdout
    small = json.loads(open(os.path.join(checkout, "data", "items_shuffle.json")).read())[:4]  # 3 distinct ASINs
    (tmp_path / "WebShop" / "data" / "items_shuffle_1000.json").write_text(json.dumps(small))
    r = _doctor(tmp_path, checkout, "authors")
    assert r.returncode == 0, r.stdout
    assert "[ok] 3 products after WebShop's deduplication in data/items_shuffle_1000.json" in r.stdout
    assert "[ok] index documents 3 vs deduplicated products 3" in r.stdout and "DEFAULT_FILE_PATH" not in r.stdout
    r = _doctor(tmp_path, checkout, "human")  # the same checkout: its index holds 3, the full set has 5
    assert r.returncode == 1 and "[MISSING] index documents 3 vs deduplicated products 5" in r.stdout


def test_webshop_doctor_warns_when_products_and_attributes_disagree(tmp_path):
    """Only DEFAULT_FILE_PATH changed: the attribute file is still the 1000-product one, so products past it get
    WebShop's placeholder attribute (here 2 of 5 covered, 3 not)."""
    utils = README_UTILS.replace("items_ins_v2.json", "items_ins_v2_1000.json")
    r = _doctor(tmp_path, _layout(tmp_path / "WebShop", utils=utils, attrs_1000=2))
    assert r.returncode == 1
    assert "[MISSING] attributes for 2 of 5 products in data/items_ins_v2_1000.json" in r.stdout
    assert "3 products get WebShop's placeholder attribute DUMMY_ATTR" in r.stdout


def test_webshop_doctor_compares_the_index_with_deduplicated_products(tmp_path):
    """A stale index (the 1000-product trap, here 3 documents) is named; the raw 7 entries never count."""
    r = _doctor(tmp_path, _layout(tmp_path / "WebShop", docs=3))
    assert r.returncode == 1 and "[MISSING] index documents 3 vs deduplicated products 5" in r.stdout
    assert "rebuild the index" in r.stdout


def test_webshop_doctor_streams_the_product_file(tmp_path, monkeypatch):
    """The products are decoded one at a time (never json.load of the multi-GB file), across buffer ends."""
    checkout = _layout(tmp_path / "WebShop")
    product_file = os.path.join(checkout, "data", "items_shuffle.json")
    for chunk in (1, 7, 64):
        assert [p["asin"] for p in webshop_doctor.iter_json_items(product_file, chunk)] == \
            ASINS[:2] + ASINS[:1] + ASINS[2:] + ["nan"]
    assert list(webshop_doctor.iter_json_items(os.path.join(checkout, "data", "items_ins_v2.json"), 5)) == \
        [(a, {"attributes": ["cotton"]}) for a in ASINS]

    def no_whole_load(*a, **k):
        raise AssertionError("json.load / json.loads of a whole data file")
    monkeypatch.setattr(json, "load", no_whole_load)
    monkeypatch.setattr(json, "loads", no_whole_load)
    checks = {what: ok for ok, what, _ in webshop_doctor.webshop_doctor(checkout, "human")}
    assert checks["5 products after WebShop's deduplication in data/items_shuffle.json"]
    assert checks["index documents 5 vs deduplicated products 5"]


def test_bm25s_imports_without_numba_so_vllm_can_start():
    """webshop.import_bm25s: with numba loaded, vLLM 0.32's CPU engine start fails on llvmlite's wrapper objects."""
    code = ("import sys; from plumbing import webshop; s = webshop.LiteSite(0, 50); "
            "assert s.search('organic tea') is not None; "
            "print('llvmlite' in sys.modules, 'numba' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(HERE), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr[-2000:]

"""The runtime environments behind one episode interface, and the pool of worker processes that plays them.

    python envs.py stats [--games builtin|official|webshop-lite]        # split sizes + expert lengths
    python envs.py webshop-doctor                                       # what an official WebShop setup lacks
    python envs.py make-games ... | make-builtin                        # ALFWorld game generation (gamegen.py)

Both environments give `reset(game, prefix) -> episode dict` (obs, admissible, won, history, prefix_steps, task,
room) and `step(ep, action) -> valid`, so the pool, the rollout loop, the scheduler and eval.py never branch on
the environment; `--env alfworld|webshop` picks one (env_spec, tasks_for).

ALFWorld: the real engine (alfworld + TextWorld's PDDL engine) on generated (gamegen.py) or official games.
Engine facts this file works around (each in one small function):
- every PddlEnv dlopens its own 34 MB copy of libdownward and never frees it: envs are created once per
  worker and reused (`AlfEnv`);
- the engine's state lives inside that C library (it has get_state but no set_state), so a prefix shared by
  R rollouts cannot be cloned; instead the PDDL translation, which dominates reset, is cached (`_cache_pddl2sas`);
- fast_downward.pddl2sas overwrites sys.argv; the expert only recognises 'put' (`gamegen.patch_expert`).

WebShop: `official` wraps the user's princeton-nlp/WebShop checkout ($WEBSHOP_PATH, its web_agent_site text
environment); `lite` is this repo's own clean-room site with the same action grammar, page flow and reward form
over a generated catalogue (gamegen.make_catalogue), searched with bm25s; lite numbers are labelled webshop-lite.
Goals are indexed by the paper's split (test 0-499, eval 500-1499, train 1500+) into one fixed goal list.
"""
import argparse
import collections
import functools
import glob
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from multiprocessing.connection import Connection

HERE = os.path.dirname(os.path.abspath(__file__))
BUILTIN_TAR = os.path.join(HERE, "data", "alfworld_builtin.tar.gz")
BUILTIN = dict(train=240, valid_seen=48, valid_unseen=48)  # games per split in the built-in set
TASK_TYPES = ["pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"]
INVALID_OBS = "Nothing happens."


def _alfworld_env():
    os.environ.setdefault("ALFWORLD_DATA", os.path.join(tempfile.gettempdir(), "alfworld_data"))



# ---------------------------------------------------------------------------------------------
# Tasks: the built-in set (shipped tarball, extracted to the cache) or the official data.
# ---------------------------------------------------------------------------------------------
def builtin_root(cache):
    root = os.path.join(cache, "alfworld_builtin")
    manifest = os.path.join(root, "manifest.json")
    with tarfile.open(BUILTIN_TAR) as tf:
        want = json.load(tf.extractfile("manifest.json"))
        if os.path.exists(manifest) and json.load(open(manifest)) == want:
            return root
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=cache)
        tf.extractall(tmp, filter="data") if sys.version_info >= (3, 12) else tf.extractall(tmp)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return root


def official_root():
    data = os.environ.get("ALFWORLD_DATA", "")
    root = os.path.join(data, "json_2.1.1")
    if not data or not os.path.isdir(root):
        raise FileNotFoundError(
            f"official ALFWorld data not found at $ALFWORLD_DATA/json_2.1.1 ({root if data else 'ALFWORLD_DATA is unset'}). "
            "Either download it on a machine with internet (`pip install alfworld && alfworld-download`, then "
            "export ALFWORLD_DATA=<that dir>), or use the built-in generated games (--games builtin).")
    return root


def load_tasks(split, games="builtin", cache=None, task_types=None, verbose=False):
    """Sorted, deterministic list of tasks: {id, gamefile, task_type, walkthrough, L}. Skips unsolvable,
    'movable' and 'Sliced' games, as alfworld does."""
    from config import cache_dir
    root = builtin_root(cache or cache_dir()) if games == "builtin" else official_root()
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
        raise FileNotFoundError(f"no split '{split}' under {root} (have: {sorted(os.listdir(root))})")
    tasks = []
    for gf in sorted(glob.glob(os.path.join(split_dir, "**", "game.tw-pddl"), recursive=True)):
        d = os.path.dirname(gf)
        if "movable" in d or "Sliced" in d:
            continue
        g = json.load(open(gf))
        if not g.get("solvable") or not g.get("walkthrough"):
            continue
        tt = json.load(open(os.path.join(d, "traj_data.json")))["task_type"]
        if task_types and tt not in task_types:
            continue
        tasks.append({"id": os.path.relpath(d, root), "gamefile": gf, "task_type": tt,
                      "walkthrough": g["walkthrough"], "L": len(g["walkthrough"])})
    if verbose:
        print(f"[envs] {games} {split}: {len(tasks)} games from {split_dir}")
    return tasks


def length_table(tasks):
    """Expert-length distribution per task type (min / mean / max, n)."""
    by = collections.defaultdict(list)
    for t in tasks:
        by[t["task_type"]].append(t["L"])
    rows = [f"{'task type':32s} {'n':>4s} {'min':>4s} {'mean':>5s} {'max':>4s}"]
    for tt in [t for t in TASK_TYPES if t in by] + sorted(set(by) - set(TASK_TYPES)) + ["all"]:
        L = [t["L"] for t in tasks] if tt == "all" else by[tt]
        if L:
            rows.append(f"{tt:32s} {len(L):4d} {min(L):4d} {sum(L) / len(L):5.1f} {max(L):4d}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# One engine object, reused across games and episodes.
# ---------------------------------------------------------------------------------------------
def _cache_pddl2sas():
    """Reset re-translates the PDDL (twice) every time: ~90% of its cost. The translation is a pure function of
    (domain, problem, optimize), so cache it per process. Also stops it clobbering sys.argv."""
    import fast_downward
    if getattr(fast_downward.pddl2sas, "_g2_cache", False):
        return
    orig, cache = fast_downward.pddl2sas, {}

    def pddl2sas(domain, problem, verbose=False, optimize=False):
        key = (hash(domain), hash(problem), optimize)
        if key not in cache:
            argv = list(sys.argv)
            cache[key] = orig(domain, problem, verbose=verbose, optimize=optimize)
            sys.argv[:] = argv
            if len(cache) > 512:
                cache.pop(next(iter(cache)))
        return cache[key]
    pddl2sas._g2_cache = True
    fast_downward.pddl2sas = pddl2sas
    import textworld.envs.pddl.logic as tw_logic
    tw_logic.fast_downward.pddl2sas = pddl2sas


def _cache_textgen_parse():
    """TextWorld's grammar re-parses the same template strings with tatsu on every step (most of a step's cost).
    The parse is a pure function of the text; derive() mutates the symbols' context, so each use gets a copy."""
    import copy
    import textworld.envs.pddl.textgen as tg
    from textworld.logic import Rule
    if getattr(tg._parse_and_convert, "_g2_cache", False):
        return
    parse = functools.lru_cache(8192)(lambda text, rule_name, trace: tg.__dict__["_g2_orig"](
        text, rule_name=rule_name, trace=trace))
    tg._g2_orig = tg._parse_and_convert

    def cached(text, rule_name="symbols", trace=False):
        return copy.deepcopy(parse(text, rule_name, bool(trace)))
    cached._g2_cache = True
    tg._parse_and_convert = cached
    orig_q = Rule.parse_conjunctive_query.__func__
    Rule.parse_conjunctive_query = classmethod(functools.lru_cache(4096)(orig_q))  # returns an immutable Rule


class AlfEnv:
    """PddlEnv + AlfredDemangler + AlfredInfos, as alfworld's AlfredTWEnv builds it, without the gym layer."""

    def __init__(self, cache_translation=True):
        _alfworld_env()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv
        if cache_translation:
            _cache_pddl2sas()
            _cache_textgen_parse()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        self.env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self.gamefile = None

    def reset(self, gamefile, prefix=()):
        """Load + reset, then execute the expert prefix in the engine. Returns the episode dict:
        obs, admissible, won, history [(obs before a, a)], prefix_steps [(obs, admissible, a)]."""
        if gamefile != self.gamefile:
            self.env.load(gamefile)
            self.gamefile = gamefile
        s = self.env.reset()
        ep = {"obs": s.feedback, "admissible": list(s["admissible_commands"]), "won": bool(s["won"]),
              "history": [], "prefix_steps": [], "task": task_text(s.feedback), "room": room_text(s.feedback),
              "room_short": room_text(s.feedback, short=True)}
        for a in prefix:
            if a not in ep["admissible"]:
                raise RuntimeError(f"expert prefix action {a!r} is not admissible in {gamefile}")
            ep["prefix_steps"].append((ep["obs"], ep["admissible"], a))
            self._step(ep, a)
        return ep

    def _step(self, ep, action):
        ep["history"].append((ep["obs"], action))
        s, _, _ = self.env.step(action)
        ep.update(obs=s.feedback, admissible=list(s["admissible_commands"]), won=bool(s["won"]))

    def step(self, ep, action):
        """Any string is accepted; an inadmissible one leaves the state unchanged ('Nothing happens.')."""
        valid = isinstance(action, str) and action in ep["admissible"]
        if valid:
            self._step(ep, action)
        else:
            ep["history"].append((ep["obs"], action if isinstance(action, str) else ""))
            ep["obs"] = INVALID_OBS
        return valid


def task_text(intro):
    """'Your task is to: put a hot apple in fridge.' -> 'put a hot apple in fridge.'"""
    i = intro.find("Your task is to:")
    return intro[i + len("Your task is to:"):].strip() if i >= 0 else ""


def room_text(intro, short=False):
    """The intro without the banner and the task sentence (short: just the receptacle list)."""
    body = intro.split("=-", 2)[-1] if "-= Welcome" in intro else intro
    i = body.find("Your task is to:")
    body = (body[:i] if i >= 0 else body).strip()
    if short and "you see" in body:
        body = body.split("you see", 1)[1].strip().rstrip(".").replace(", and ", ", ").replace("a ", "")
    return body


# ---------------------------------------------------------------------------------------------
# WebShop: one episode interface over two backends. `lite` is this repo's clean-room site over a generated
# catalogue (gamegen.make_catalogue); `official` drives the user's own princeton-nlp/WebShop checkout.
# Both render WebShop's text mode (' [SEP] '-joined page strings), take search[...] / click[...] actions, and
# report the raw reward (score in [0, 1]); won = (score == 1). Observations drop the instruction (it is the task).
# ---------------------------------------------------------------------------------------------
WEBSHOP_SPLITS = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)}  # paper: goal indices
SEARCH_ACTION = "search[<query>]"  # the admissible form of a search; the query is free text
RESULTS_PER_PAGE, SEARCH_K = 10, 50
COLORS = sorted(["black", "white", "navy", "blue", "red", "grey", "gray", "green", "olive", "pink", "silver", "beige",
                 "ivory", "teal", "brown", "purple", "yellow", "orange", "gold"])  # alphabetical, as WebShop's scan
STOPWORDS = set("a an and the for of to in on with by at from is are be i me my need want looking find get buy "
                "that this it its under than lower price dollars".split())


SPECIAL_QUERY_WORDS = {"<a>", "<q>", "<c>", "<r>"}  # WebShop engine.py get_top_n_product_from_keywords: commands


def parse_webshop_action(action):
    """'search[red mug]' -> ('search', 'red mug'); 'click[Buy Now]' -> ('click', 'buy now'); else None.
    Queries lose their brackets: WebShop's parse_action (engine.py, a greedy '(name)[(arg)]' match) reads
    'search[a [b]]' as the action 'search[a ' and then does nothing. A query whose first word is <a>, <q>, <c> or
    <r> is invalid: WebShop's engine.py (get_top_n_product_from_keywords) takes it as a command (<a> raises a
    TypeError, <q>/<c> filter by exact query/category, <r> samples at random), which the authors' projection
    rejects [ZJU-REAL/Agent-G2 agent_system/environments/env_package/webshop/projection.py]. Click arguments
    keep their text; bracketed clickables are never admissible (webshop_admissible)."""
    m = re.fullmatch(r"\s*(search|click)\[(.+)\]\s*", action or "", flags=re.S)
    if not m:
        return None
    arg = m.group(2).lower()
    if m.group(1) == "search":
        arg = arg.replace("[", " ").replace("]", " ")
    arg = " ".join(arg.split())
    if not arg or (m.group(1) == "search" and arg.split()[0] in SPECIAL_QUERY_WORDS):
        return None
    return m.group(1), arg


def clickable_ok(text):
    """WebShop's parse_action (engine.py) cannot click a value that holds '[' (the name swallows it): such
    values are left out of the clickables, so clicking them is an invalid step."""
    return "[" not in text and text != "search"


def webshop_admissible(has_search_bar, clickables):
    """WebShop's get_available_actions (web_agent_text_env.py): the search bar only on the search page, then the
    page's buttons, product links and option values, in that order."""
    return ([SEARCH_ACTION] if has_search_bar else []) + [f"click[{c}]" for c in clickables if clickable_ok(c)]


def normalize_color(text):
    """The first colour word found inside text, else text: WebShop's normalize.py scans an alphabetical colour
    list by substring ('navy blue' -> 'blue'); ours is a smaller list of our own, scanned the same way."""
    return next((c for c in COLORS if c in text), text)


def title_nouns(text):
    """Content words of a title: the lite stand-in for WebShop's spaCy nouns (no model download). Lower-cased
    alphabetic tokens of 3+ letters that are not stopwords."""
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 3 and w not in STOPWORDS}


def fuzzy_ratio(a, b):
    """WebShop's fuzzy score: thefuzz 0.19 (requirements.txt) token_set_ratio, which lower-cases, turns
    punctuation into spaces and rounds to an int (so 85.7 counts as 86 > 85 and 85.4 as 85, not a match)."""
    from rapidfuzz import fuzz, utils
    return int(round(fuzz.token_set_ratio(a, b, processor=utils.default_process)))


def goal_option_texts(goal_options):
    """What each goal option is matched as. A synthetic goal (dict, like all lite goals): WebShop's get_reward
    (goal.py) passes goal_options.items(), so each goal option is the (name, value) pair; normalize_color of a
    pair is a colour only when the value is exactly one, else the pair, which thefuzz scores as the text
    'name value'. A human goal (list, like the official backend's): the value, colour-normalised."""
    if isinstance(goal_options, dict):
        return [v if v in COLORS else f"{k} {v}" for k, v in goal_options.items()]
    return [normalize_color(v) for v in goal_options]


def webshop_reward(goal, product, options):
    """WebShop's reward (goal.py get_reward): (attribute matches + option matches + price ok) / (#attributes +
    #options + 1), times a type factor. product: {Title, BulletPoints, Description, Attributes, price, query,
    product_category}; options: the option values chosen. -> (reward, info). Fuzzy matches: fuzzy_ratio > 85.
    Options are scored as WebShop scores synthetic goals, by (name, value) pairs (goal_option_texts): a wrong
    size such as '24 pack' for '12 pack' (85.7 by value alone) no longer matches."""
    title, desc = product["Title"].lower(), product["Description"].lower()
    bullets = " ".join(product["BulletPoints"]).lower()
    n_att = sum(any(fuzzy_ratio(pa, a) > 85 for pa in product["Attributes"])  # goal.py get_attribute_reward:
                or a in title or a in bullets or a in desc for a in goal["attributes"])  # then each text field
    want = goal_option_texts(goal["goal_options"])
    chosen = [normalize_color(v) for v in options]
    n_opt = sum(any(fuzzy_ratio(c, w) > 85 for c in chosen) for w in want)
    r_price = float(product["price"] <= goal["price_upper"])
    query_match = product["query"] == goal["query"]
    cats = lambda c: {x.strip() for x in c.lower().split("›")}  # noqa: E731
    category_match = len(cats(product["product_category"]) & cats(goal["product_category"])) >= 2
    gn = title_nouns(goal["name"])
    title_score = len(gn & title_nouns(product["Title"])) / len(gn) if gn else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    r_type = 0.0 if title_score == 0 else 0.1 if title_score < 0.1 else r_type
    total = (n_att + n_opt + r_price) / (len(goal["attributes"]) + len(want) + 1) * r_type
    return total, dict(r_att=n_att, w_att=len(goal["attributes"]), r_option=n_opt, w_option=len(want),
                       r_price=r_price, r_type=r_type, query_match=query_match, category_match=category_match,
                       title_score=title_score, reward_impl="webshop-lite")


class LiteSite:
    """The lite backend's site: normalised catalogue (WebShop's load semantics: Title, BulletPoints, lower-cased
    options with '/' -> ' | ', one price per product), a BM25 index over title + description + first bullet +
    option text (bm25s, Lucene scoring, k1 0.9, b 0.4, English stopwords, Snowball stems) and the shuffled goals.
    Page state is a small dict, so one site serves any number of concurrent episodes."""

    def __init__(self, seed=0, n_products=1000):
        import Stemmer
        from gamegen import fixed_price, make_catalogue
        raw, attrs, self.goals = make_catalogue(seed, n_products)
        self.products = {}
        for p in raw:
            opts = {k.lower(): [" ".join(v["value"].lower().replace("/", " | ").split()) for v in vals]
                    for k, vals in (p["customization_options"] or {}).items()}
            self.products[p["asin"]] = {
                "asin": p["asin"], "Title": p["name"], "Description": p["full_description"],
                "BulletPoints": list(p["small_description"]), "options": opts, "price": fixed_price(p),
                "Price": price_tag(p["pricing"]),
                "Attributes": attrs[p["asin"]]["attributes"], "query": p["query"].lower().strip(),
                "product_category": p["product_category"]}
        self.asins = list(self.products)
        docs = [" ".join([q["Title"], q["Description"], q["BulletPoints"][0],
                          ", and ".join(f"{k}: {', '.join(v)}" for k, v in q["options"].items())]).lower()
                for q in self.products.values()]
        self.stemmer = Stemmer.Stemmer("english")
        bm25s = import_bm25s()
        self.bm25 = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
        self.bm25.index(bm25s.tokenize(docs, stopwords="en", stemmer=self.stemmer, show_progress=False),
                        show_progress=False)

    def search(self, query, k=SEARCH_K):
        """Top-k ASINs by BM25 (ties by catalogue order); [] when no query word is in the index."""
        import numpy as np
        q = import_bm25s().tokenize([query], stopwords="en", stemmer=self.stemmer, show_progress=False, return_ids=False)[0]
        if not q:
            return []
        s = np.asarray(self.bm25.get_scores(q))
        order = np.lexsort((np.arange(len(s)), -s))
        return [self.asins[i] for i in order[:k] if s[i] > 0]

    def view(self, st):
        """(text observation without the instruction, has_search_bar, clickables) of page state st."""
        kind = st["kind"]
        if kind == "search":
            return "Search", True, ["search"]
        if kind == "results":
            n, p = len(st["results"]), st["page"]
            hits = st["results"][(p - 1) * RESULTS_PER_PAGE:p * RESULTS_PER_PAGE]
            nav = (["< Prev"] if p > 1 else []) + ["Next >"]  # results_page.html: 'Next >' on every page
            parts = ["Back to Search", f"Page {p} (Total results: {n})"] + nav
            for a in hits:
                parts += [a, self.products[a]["Title"], self.products[a]["Price"]]
            return " [SEP] ".join(parts), False, ["back to search"] + [x.lower() for x in nav] + [a.lower() for a in hits]
        q = self.products[st["asin"]]
        if kind == "item":  # item_page.html in text mode: options (no mark on the chosen ones) before the title;
            # the clickables list the buttons first, then the option values (web_agent_text_env.py
            # get_available_actions: buttons + product links, then the radio inputs)
            parts = ["Back to Search", "< Prev"]
            for name, vals in q["options"].items():
                parts += [name] + vals
            parts += [q["Title"], f"Price: {q['Price']}", "Rating: N.A.", "Description", "Features", "Reviews",
                      "Buy Now"]
            buttons = ["back to search", "< prev", "description", "features", "reviews", "buy now"]
            return " [SEP] ".join(parts), False, buttons + [v for vals in q["options"].values() for v in vals]
        # description / features / review pages; WebShop's text env loads no reviews, so that page is empty
        body = {"description": [q["Description"]], "features": q["BulletPoints"], "reviews": []}[kind]
        return " [SEP] ".join(["Back to Search", "< Prev"] + body), False, ["back to search", "< prev"]

    def move(self, st, kind, arg):
        """Next page state after a valid action (the caller checked it against the page's clickables)."""
        if kind == "search":
            return {"kind": "results", "query": arg, "results": self.search(arg), "page": 1}
        if arg == "back to search":
            return {"kind": "search"}
        if st["kind"] == "results":
            if arg in ("next >", "< prev"):
                return {**st, "page": st["page"] + (1 if arg == "next >" else -1)}
            return {"kind": "item", "asin": arg.upper(), "options": {}, "back": st}
        if st["kind"] == "item":
            if arg == "< prev":
                return st["back"]
            if arg in ("description", "features", "reviews"):
                return {**st, "kind": arg, "item": st}
            name = next(n for n, vals in self.products[st["asin"]]["options"].items() if arg in vals)
            return {**st, "options": {**st["options"], name: arg}}
        return st["item"]  # a sub-page's '< prev'


def price_tag(pricing):
    """A raw pricing string as WebShop shows it (engine.py load_products): each '$' amount as a Python float,
    '$12.5' or '$12.5 to $20.0' for a range; the reward uses one hidden price inside the range (fixed_price)."""
    ends = [float(re.sub(r"[^\d.]", "", x)) for x in (pricing or "").split("$")[1:]][:2] or [100.0]
    return " to ".join(f"${x}" for x in ends)


def import_bm25s():
    """bm25s imports numba (so llvmlite) whenever it is installed; vLLM 0.32's CPU kernel dispatcher then trips
    over llvmlite's library wrapper while it scans sys.modules at engine start ("'_lib_fn_wrapper' object has no
    attribute 'get'"). We use bm25s's numpy scoring only, so numba is hidden while bm25s imports."""
    if "bm25s" in sys.modules or "numba" in sys.modules:
        import bm25s
        return bm25s
    sys.modules["numba"] = None  # `import numba` -> ImportError, which bm25s handles
    try:
        import bm25s
    finally:
        del sys.modules["numba"]
    return bm25s


@functools.lru_cache(4)
def lite_site(seed=0, n_products=1000):
    return LiteSite(seed, n_products)


def _official_env_class(path=""):
    """The user's WebShop text environment class. WEBSHOP_PATH (or `path`) is put on sys.path; the PyPI package
    `webshop` is a stub without it and is not used."""
    path = path or os.environ.get("WEBSHOP_PATH", "")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
    except ImportError as e:
        raise ImportError(f"official WebShop not importable ({e}). Set WEBSHOP_PATH to your princeton-nlp/WebShop "
                          "checkout and run `python envs.py webshop-doctor`; or use --webshop_backend lite") from e
    return WebAgentTextEnv


_OFFICIAL_SERVER = {}


class WebShopEnv:
    """reset(goal index, prefix) / step(ep, action), the AlfEnv interface. spec: {"backend": "lite"|"official",
    "seed", "products", "path", "max_steps"}. Lite keeps the page state in the episode dict; official keeps it in
    its WebAgentTextEnv (one per concurrent episode, all sharing one SimServer: catalogue and index load once)."""

    def __init__(self, spec):
        self.spec, self.gamefile = spec, None
        if spec["backend"] == "lite":
            self.site = lite_site(spec["seed"], spec["products"])
            self.goals = self.site.goals
        else:
            cls = _official_env_class(spec.get("path", ""))
            if "server" not in _OFFICIAL_SERVER:  # the first env of the process builds the catalogue and goals
                random.seed(spec["seed"])  # WebShop draws goal price caps from the global `random` before its shuffle
            # the session key is prefix + goal index, and the page state lives in the shared server under it: every
            # env object (one per concurrent episode) needs its own prefix, or R rollouts of a goal share one page
            _OFFICIAL_SERVER["n"] = _OFFICIAL_SERVER.get("n", 0) + 1
            self.env = cls(observation_mode="text", num_products=None, human_goals=True,
                           server=_OFFICIAL_SERVER.get("server"), session_prefix=f"g2-{os.getpid()}-{_OFFICIAL_SERVER['n']}-")
            _OFFICIAL_SERVER["server"] = self.env.server
            self.goals = self.env.server.goals

    def reset(self, gamefile, prefix=()):
        gamefile = int(gamefile)  # a NumPy index too (see the official reset below)
        goal = self.goals[gamefile]
        self.gamefile = gamefile
        ep = {"goal_index": gamefile, "task": goal["instruction_text"], "history": [], "prefix_steps": [],
              "won": False, "score": 0.0, "done": False, "steps": 0, "room": "", "room_short": ""}
        if self.spec["backend"] == "lite":
            ep["page"] = {"kind": "search"}
            self._show(ep, *self.site.view(ep["page"]))
        else:
            # a Python int (made above): WebShop's reset and SimServer.receive (web_agent_text_env.py) pick the
            # goal only when isinstance(session, int); a NumPy integer silently got a random goal
            obs, _ = self.env.reset(session=gamefile)
            self._show(ep, _strip_instruction(obs), *self._official_actions())
        for a in prefix:  # step() validates the action and appends (obs, a) to the history
            ep["prefix_steps"].append((ep["obs"], ep["admissible"], a))
            if not self.step(ep, a):
                raise RuntimeError(f"expert prefix action {a!r} is not admissible for WebShop goal {gamefile}")
        return ep

    def _official_actions(self):
        av = self.env.get_available_actions()
        self.click_as = {" ".join(c.lower().split()): c for c in av["clickables"]}  # our normalised text -> theirs
        return av["has_search_bar"], list(self.click_as)

    def _show(self, ep, obs, has_search, clicks):
        clicks = [c for c in clicks if clickable_ok(c)]
        ep.update(obs=obs, page_obs=obs, has_search=has_search, clickables=clicks,
                  admissible=webshop_admissible(has_search, clicks))

    def step(self, ep, action):
        """Invalid (unparseable, a special search word, not on this page, after the end or past max_steps): the
        page stays, the observation says so, and the step still counts. A search is valid from any page, as in
        WebShop's step (web_agent_text_env.py searches whenever the action is search[non-empty]), although the
        admissible list offers it on the search page only (WebShop's has_search_bar)."""
        ep["history"].append((ep["obs"], action if isinstance(action, str) else ""))
        ep["steps"] += 1
        act = parse_webshop_action(action) if isinstance(action, str) else None
        ok = act is not None and not ep["done"] and ep["steps"] <= self.spec["max_steps"] and (
            act[0] == "search" or (act[0] == "click" and act[1] in ep["clickables"]))
        if not ok:
            ep["obs"] = "Invalid action. " + ep["page_obs"]
            return False
        kind, arg = act
        if self.spec["backend"] == "lite":
            if arg == "buy now":
                goal = self.goals[ep["goal_index"]]
                ep["score"] = webshop_reward(goal, self.site.products[ep["page"]["asin"]],
                                             list(ep["page"]["options"].values()))[0]
                self._finish(ep)
            else:
                ep["page"] = self.site.move(ep["page"], kind, arg)
                self._show(ep, *self.site.view(ep["page"]))
        else:
            obs, reward, done, _ = self.env.step(f"{kind}[{self.click_as.get(arg, arg) if kind == 'click' else arg}]")
            if done:
                ep["score"] = float(reward)
                self._finish(ep)
            else:
                self._show(ep, _strip_instruction(obs), *self._official_actions())
        return True

    def _finish(self, ep):
        ep.update(done=True, won=ep["score"] == 1.0)
        self._show(ep, f"Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {ep['score']:.2f}",
                   False, [])


def _strip_instruction(obs):
    """WebShop text pages begin '[WebShop [SEP]] Instruction: [SEP] <instruction> [SEP] ...': keep the rest."""
    parts = obs.split(" [SEP] ")
    if parts and parts[0] == "WebShop":
        parts = parts[1:]
    if parts and parts[0] == "Instruction:":
        parts = parts[2:]
    return " [SEP] ".join(parts)


def expert_query(goal):
    """What the scripted expert types: the instruction up to its options / price clause."""
    return re.split(r" with |, and price lower than", goal["instruction_text"])[0]


def scripted_expert(env, gamefile, max_pages=5):
    """search[goal words] -> (next pages until the target shows) -> click[target] -> click[each goal option]
    -> click[buy now], played through env (either backend). -> (actions, score)."""
    from rapidfuzz import fuzz
    goal = env.goals[gamefile]
    ep = env.reset(gamefile)
    acts = []

    def act(a):
        acts.append(a)
        if not env.step(ep, a):
            raise RuntimeError(f"scripted expert: {a!r} invalid on goal {gamefile}")
    target = f"click[{goal['asin'].lower()}]"
    for query in (expert_query(goal), goal["name"].lower()):
        act(f"search[{query}]")
        for _ in range(max_pages):
            m = re.search(r"Page (\d+) \(Total results: (\d+)\)", ep["obs"])
            last = m is None or int(m.group(1)) * RESULTS_PER_PAGE >= int(m.group(2))  # 'Next >' is always shown
            if target in ep["admissible"] or last or "click[next >]" not in ep["admissible"]:
                break
            act("click[next >]")
        if target in ep["admissible"]:
            break
        act("click[back to search]")
    act(target)
    want = goal["goal_options"].values() if isinstance(goal["goal_options"], dict) else goal["goal_options"]
    for v in want:
        opts = [c for c in ep["clickables"] if c not in ("back to search", "< prev", "description", "features",
                                                          "reviews", "buy now")]
        if opts:
            act(f"click[{max(opts, key=lambda c: (c == v.lower(), fuzz.token_set_ratio(c, v.lower())))}]")
    act("click[buy now]")
    return acts, ep["score"]


def goal_target_key(goal):
    """(ASIN, sorted option values with counts), values lower-cased and space-normalised: how the authors' code
    tells WebShop goals apart and keys its expert data [ZJU-REAL/Agent-G2 gmsv/webshop.py goal_to_target_key]."""
    vals = goal.get("goal_options") or {}
    vals = vals.values() if isinstance(vals, dict) else vals
    return str(goal.get("asin", "")).upper(), tuple(sorted(collections.Counter(" ".join(str(v).lower().split())
                                                                                for v in vals).items()))


def webshop_split_indices(goals, name, scheme="paper"):
    """Goal indices of split `name` (test | eval | train). scheme 'paper': WebShop's baseline split, the ranges of
    WEBSHOP_SPLITS. scheme 'authors': the authors' code [ZJU-REAL/Agent-G2 agent_system/environments/env_package/
    webshop/envs.py]: validation = the first 500 goals in order after dropping repeated (ASIN, options) goals
    (goal_target_key), used here for both test and eval; train = goals 500+ (which may repeat a validation goal's
    key, as there by default)."""
    n = len(goals)
    if scheme == "paper":
        lo, hi = WEBSHOP_SPLITS[name]
        return list(range(lo, min(hi or n, n)))
    if scheme != "authors":
        raise ValueError(f"WebShop split scheme {scheme!r}: expected paper | authors")
    if name == "train":
        return list(range(500, n))
    seen, idx = set(), []
    for i, g in enumerate(goals):
        k = goal_target_key(g)
        if k not in seen:
            seen.add(k)
            idx.append(i)
            if len(idx) == 500:
                break
    return idx


def load_webshop_tasks(split, spec, cache=None, demos="", verbose=False, only=None):
    """Tasks of a WebShop split (webshop_split_indices under spec['split'], paper by default: the goal-index
    ranges of WEBSHOP_SPLITS; ALFWorld's valid_* names mean 'eval').
    gamefile = the goal index. Evaluation splits keep every goal of their range (hint-free evaluation needs no
    walkthrough). The train split keeps the goals with a reward-1 walkthrough: from `demos` (JSON {goal index:
    [actions]}), else from the scripted expert (for the official backend cached under `cache`, failures included,
    keyed by the goal list, since playing ~10k goals takes a while). only: a subset of goal indices to keep (a
    seeded sample, e.g. the contract test on a real install)."""
    import hashlib
    from config import cache_dir
    name = {"valid_seen": "eval", "valid_unseen": "eval"}.get(split, split)
    if name not in WEBSHOP_SPLITS:
        raise ValueError(f"WebShop split {split!r}: expected one of {sorted(WEBSHOP_SPLITS)}")
    env = WebShopEnv({**spec, "max_steps": 10**6})  # the expert is not bound by the episode step limit
    idx = webshop_split_indices(env.goals, name, spec.get("split", "paper"))
    lo, hi = WEBSHOP_SPLITS[name]
    if only is not None:
        keep = set(only)
        idx = [i for i in idx if i in keep]
    if not idx:
        raise ValueError(f"WebShop {spec['backend']}: {len(env.goals)} goals, none in split {name} {lo}..{hi}")
    walks = {int(k): v for k, v in json.load(open(demos)).items()} if demos else {}
    path = None
    if spec["backend"] == "official" and name == "train":
        key = hashlib.sha1(json.dumps([(g["asin"], g["instruction_text"]) for g in env.goals]).encode()).hexdigest()
        path = os.path.join(cache or cache_dir(), f"webshop_official_experts_{key[:12]}.json")
        walks = {**({int(k): v for k, v in json.load(open(path)).items()} if os.path.exists(path) else {}), **walks}
    tasks = []
    for i in idx:
        if name == "train" and i not in walks:
            try:
                walk, score = scripted_expert(env, i)
            except RuntimeError:  # the target never showed up in the results
                walk, score = None, 0.0
            walks[i] = walk if score == 1.0 else None
        walk = walks.get(i) or []
        if name == "train" and not walk:
            continue  # no reward-1 demonstration: no hints to give
        g = env.goals[i]
        tasks.append({"id": f"webshop-{spec['backend']}/{i}", "gamefile": i, "task_type": g.get("category", "webshop"),
                      "walkthrough": walk, "L": len(walk)})
    if path:  # atomic: every rank writes the same content
        json.dump(walks, open(path + f".{os.getpid()}", "w"))
        os.replace(path + f".{os.getpid()}", path)
    if verbose:
        print(f"[envs] webshop-{spec['backend']} {name}: {len(tasks)} goals (indices {idx[0]}..{idx[-1]})")
    return tasks


# ---------------------------------------------------------------------------------------------
# Env pool: episodes live in worker processes; requests for one turn go out together.
# ---------------------------------------------------------------------------------------------
def _worker_main(fd, spec_json):
    from multiprocessing.connection import Connection
    _worker(Connection(fd), json.loads(spec_json))


def make_env(spec):
    """spec: {"env": "alfworld", "cache_translation"} or {"env": "webshop", "backend", "seed", "products", ...}."""
    if spec["env"] == "alfworld":
        return AlfEnv(spec.get("cache_translation", True))
    if spec["env"] == "webshop":
        return WebShopEnv(spec)
    raise ValueError(f"unknown env {spec['env']!r} (alfworld | webshop)")


def _worker(conn, spec):
    """Holds engine objects (one per concurrent episode, reused) and the episodes' Python state."""
    envs, free, eps = [], [], {}  # eps: episode id -> (env index, episode dict)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        out = []
        for req in msg:
            try:
                if req[0] == "reset":
                    _, eid, gamefile, prefix = req
                    if eid in eps:
                        free.append(eps.pop(eid)[0])
                    if not free:
                        envs.append(make_env(spec))
                        free.append(len(envs) - 1)
                    same = [j for j in free if envs[j].gamefile == gamefile]  # skip the load when possible
                    i = same[-1] if same else free[-1]
                    free.remove(i)
                    try:
                        ep = envs[i].reset(gamefile, prefix)
                    except Exception:
                        free.append(i)
                        raise
                    eps[eid] = (i, ep)
                    out.append({"ok": True, **ep})
                elif req[0] == "step":
                    _, eid, action = req
                    i, ep = eps[eid]
                    valid = envs[i].step(ep, action)
                    out.append({"ok": True, "valid": valid, "obs": ep["obs"], "admissible": ep["admissible"],
                                "won": ep["won"], "score": ep.get("score", float(ep["won"])),
                                "done": ep.get("done", ep["won"])})  # WebShop: any purchase ends the episode
                elif req[0] == "close":
                    if req[1] in eps:  # the engine keeps its game loaded for the next episode of it
                        free.append(eps.pop(req[1])[0])
                    out.append({"ok": True})
                elif req[0] == "crash":  # test hook: die like a segfaulting engine would
                    os._exit(3)
                else:
                    raise ValueError(f"unknown request {req[0]!r}")
            except Exception as e:
                out.append({"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})
        conn.send(out)


class EnvPool:
    """`run(requests)` -> one result per request, in order. Requests: ("reset", eid, gamefile, prefix),
    ("step", eid, action), ("close", eid). An episode lives on the worker its reset went to. A worker that dies is
    restarted; its requests come back as {"ok": False, "error": "worker crashed ..."} and the rest of the batch
    is unaffected. Create the pool before any CUDA initialisation."""

    def __init__(self, num_workers=2, spec=None):
        self.n, self.spec = max(1, num_workers), spec or {"env": "alfworld"}
        self.procs, self.conns = [None] * self.n, [None] * self.n
        self.restarts, self.home = 0, {}  # home: episode id -> worker
        for w in range(self.n):
            self._start(w)

    def _start(self, w):
        """A fresh interpreter per worker (not fork: safe after CUDA/vLLM init; not multiprocessing's spawn:
        that would re-run a top-level script such as train.py), talking over a socketpair Connection."""
        a, b = socket.socketpair()
        code = (f"import sys; sys.path.insert(0, {HERE!r}); import envs; "
                f"envs._worker_main({b.fileno()}, {json.dumps(self.spec)!r})")
        self.procs[w] = subprocess.Popen([sys.executable, "-c", code], pass_fds=[b.fileno()])
        b.close()
        self.conns[w] = Connection(a.detach())

    def run(self, requests):
        # resets of one game go to one worker (its translation cache and loaded engines serve the whole group);
        # distinct games of the call are spread round-robin; later requests follow their episode
        games = sorted({r[2] for r in requests if r[0] == "reset"})
        for r in requests:
            if r[0] == "reset":
                self.home[r[1]] = games.index(r[2]) % self.n
        by_w = collections.defaultdict(list)
        for j, req in enumerate(requests):
            by_w[self.home.get(req[1], req[1] % self.n)].append(j)
        for w, js in by_w.items():
            try:
                self.conns[w].send([requests[j] for j in js])
            except (BrokenPipeError, OSError):
                pass  # noticed on recv
        results = [None] * len(requests)
        for w, js in by_w.items():
            try:
                got = self.conns[w].recv()
            except (EOFError, OSError, ConnectionResetError):
                try:
                    code = self.procs[w].wait(5)
                except subprocess.TimeoutExpired:
                    self.procs[w].kill()
                    code = "killed"
                got = [{"ok": False, "error": f"worker crashed (exit code {code}); episode lost"}] * len(js)
                self.restarts += 1
                self._start(w)
            for j, r in zip(js, got):
                results[j] = r
        for r in requests:
            if r[0] == "close":
                self.home.pop(r[1], None)
        return results

    def kill_worker(self, w):  # test hook
        self.procs[w].kill()
        self.procs[w].wait()

    def close(self):
        for w in range(self.n):
            try:
                self.conns[w].send(None)
            except Exception:
                pass
            try:
                self.procs[w].wait(2)
            except subprocess.TimeoutExpired:
                self.procs[w].kill()


def env_spec(cfg):
    """What a pool worker needs to build its environment, from the run config."""
    if cfg.env == "webshop":  # split: paper | authors (webshop_split_indices); paper until config declares it
        return {"env": "webshop", "backend": cfg.webshop_backend, "seed": cfg.webshop_seed,
                "products": cfg.webshop_products, "path": os.environ.get("WEBSHOP_PATH", ""),
                "max_steps": cfg.max_steps, "split": getattr(cfg, "webshop_split", "paper")}
    return {"env": "alfworld"}


def tasks_for(cfg, split, verbose=False):
    """The tasks of a split for the configured environment (ALFWorld games or WebShop goals)."""
    if cfg.env == "webshop":
        return load_webshop_tasks(split, env_spec(cfg), cfg.cache_dir or None, cfg.webshop_demos, verbose)
    return load_tasks(split, cfg.games, cfg.cache_dir or None, cfg.task_types.split(",") if cfg.task_types else None,
                      verbose)


def train_subset(tasks, n):
    """--train_games: a fixed seeded subset of n tasks (all when n = 0), in split order; balanced over task types
    in expectation. The same subset in train.py and eval.py."""
    import numpy as np
    return [tasks[i] for i in sorted(np.random.default_rng(1234).permutation(len(tasks))[:n])] if n else tasks


def batch_indices(step, B, N, seed):
    """|B| task indices of a training step: epoch-wise permutations of the N tasks seeded by (seed, epoch), read
    in order across epoch boundaries. A pure function of the step, so a resumed run sees the same batches."""
    import numpy as np
    idx, epoch = [], (step * B) // N
    while len(idx) < B:
        perm = np.random.default_rng([seed, epoch]).permutation(N)
        start = (step * B + len(idx)) - epoch * N
        idx += perm[start:start + B - len(idx)].tolist()
        epoch += 1
    return idx


WEBSHOP_DATA_PATHS = {  # web_agent_site/utils.py names -> what reads them
    "DEFAULT_FILE_PATH": "the products (engine.py load_products)",
    "DEFAULT_ATTR_PATH": "the product attributes (load_products; DUMMY_ATTR for a product missing there)",
    "HUMAN_ATTR_PATH": "the human instructions = the goals (load_products)",
    "DEFAULT_REVIEW_PATH": "not read (load_products has the reviews commented out)",
    "FEAT_CONV": "image features, read only with get_image",
    "FEAT_IDS": "image feature ids, read only with get_image",
}
WEBSHOP_NEEDED = ("DEFAULT_FILE_PATH", "DEFAULT_ATTR_PATH", "HUMAN_ATTR_PATH")


def webshop_utils_paths(path):
    """{name: absolute path} for the data paths in WebShop's web_agent_site/utils.py, as Python binds them: the
    last assignment that is not commented out (WebShop's README has users leave the *_1000 lines commented above
    the full ones). Paths are join(BASE_DIR, '<relative>') there, BASE_DIR being web_agent_site/."""
    utils = os.path.join(path, "web_agent_site", "utils.py")
    base, out = os.path.dirname(utils), {}
    for line in open(utils) if os.path.exists(utils) else []:
        code = line.split("#", 1)[0]
        m = re.match(r"\s*([A-Z_]+)\s*=(.*)", code)
        strs = re.findall(r"['\"]([^'\"]*)['\"]", m.group(2)) if m and m.group(1) in WEBSHOP_DATA_PATHS else []
        if strs:
            out[m.group(1)] = os.path.normpath(os.path.join(base, strs[-1]))
    return out


def iter_json_items(path, chunk=1 << 24):
    """The top-level items of a JSON array (values) or object ((key, value) pairs), decoded one at a time with
    json.JSONDecoder.raw_decode over a sliding buffer: a multi-GB product file never loads whole."""
    dec, ws = json.JSONDecoder(), " \t\r\n"
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False

        def fill():
            nonlocal buf, pos, eof
            more = f.read(chunk)
            eof = not more
            buf, pos = buf[pos:] + more, 0

        def skip(chars):
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in chars:
                    pos += 1
                if pos < len(buf) or eof:
                    return
                fill()

        def decode():  # one JSON value at pos; refill while it may be cut off by the end of the buffer
            nonlocal pos
            while True:
                try:
                    v, end = dec.raw_decode(buf, pos)
                    if end < len(buf) or eof:
                        pos = end
                        return v
                except json.JSONDecodeError:
                    if eof:
                        raise
                fill()

        skip(ws)
        if pos >= len(buf) or buf[pos] not in "[{":
            raise ValueError(f"{path}: not a JSON array or object")
        is_obj, close = buf[pos] == "{", "}" if buf[pos] == "{" else "]"
        pos += 1
        while True:
            skip(ws + ",")
            if pos >= len(buf) or buf[pos] == close:
                return
            if is_obj:
                key = decode()
                skip(ws + ":")
                yield key, decode()
            else:
                yield decode()


def webshop_product_asins(path):
    """The ASINs WebShop's load_products keeps, in order: it skips 'nan', ASINs over 10 characters and repeats."""
    seen = {}
    for p in iter_json_items(path):
        a = p.get("asin") if isinstance(p, dict) else None
        if isinstance(a, str) and a != "nan" and len(a) <= 10:
            seen.setdefault(a, None)
    return list(seen)


def webshop_doctor(path=""):
    """Check an official WebShop setup; -> list of (ok, what, fix). Looks at files and versions, imports nothing
    heavy: the data paths utils.py sets (its uncommented lines), that they exist, that the attribute file covers
    the product file, the search index's document count against the deduplicated product count (products are
    streamed, never loaded whole), the spaCy model, and Java against the installed pyserini."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version
    path = path or os.environ.get("WEBSHOP_PATH", "")
    out = []
    if not path or not os.path.isdir(os.path.join(path, "web_agent_site")):
        return [(False, f"WEBSHOP_PATH={path or '(unset)'} holds no web_agent_site/",
                 "git clone https://github.com/princeton-nlp/WebShop and export WEBSHOP_PATH=<that dir>")]
    out.append((True, f"checkout at {path}", ""))
    paths = webshop_utils_paths(path)
    rel = lambda p: os.path.relpath(p, path)  # noqa: E731
    for name, what in WEBSHOP_DATA_PATHS.items():
        if name not in paths:
            if name in WEBSHOP_NEEDED:
                out.append((False, f"utils.py sets no {name}", "restore web_agent_site/utils.py from the checkout"))
            continue
        ok = os.path.exists(paths[name]) or name not in WEBSHOP_NEEDED
        out.append((ok, f"utils.py {name} -> {rel(paths[name])} ({what})" + ("" if os.path.exists(paths[name])
                                                                              else ", absent"),
                    "" if ok else "run ./setup.sh -d all (Google Drive via gdown), or point utils.py at your files"))
    prod, attr = paths.get("DEFAULT_FILE_PATH", ""), paths.get("DEFAULT_ATTR_PATH", "")
    asins = webshop_product_asins(prod) if os.path.exists(prod) else None
    if asins is not None:
        small = os.path.basename(prod) == "items_shuffle_1000.json"
        out.append((True, f"{len(asins)} products after WebShop's deduplication in {rel(prod)}",
                    "the 1000-product preview; the paper's split needs the full set: setup.sh -d all and point "
                    "DEFAULT_FILE_PATH at items_shuffle.json, DEFAULT_ATTR_PATH at items_ins_v2.json" if small else ""))
    if asins is not None and os.path.exists(attr):
        have = {k for k, v in iter_json_items(attr) if isinstance(v, dict) and "attributes" in v}
        miss = sum(a not in have for a in asins)
        out.append((miss == 0, f"attributes for {len(asins) - miss} of {len(asins)} products in {rel(attr)}",
                    "" if miss == 0 else f"the product and attribute files disagree: {miss} products get WebShop's "
                    "placeholder attribute DUMMY_ATTR, which changes the attribute reward and the expert's success; "
                    "point DEFAULT_ATTR_PATH at the attribute file of DEFAULT_FILE_PATH's set (items_ins_v2.json "
                    "for items_shuffle.json, items_ins_v2_1000.json for items_shuffle_1000.json)"))
    # the text env (num_products=None) searches search_engine/indexes, built from resources/documents.jsonl, one
    # line per product that load_products keeps (search_engine/convert_product_file_format.py, run_indexing.sh)
    docs = os.path.join(path, "search_engine", "resources", "documents.jsonl")
    n_docs = sum(1 for _ in open(docs)) if os.path.exists(docs) else 0
    index = os.path.join(path, "search_engine", "indexes")
    idx_ok = os.path.isdir(index) and bool(os.listdir(index)) and n_docs > 0
    out.append((idx_ok, f"search_engine/indexes ({n_docs} documents in resources/)",
                "" if idx_ok else "cd search_engine && python convert_product_file_format.py && bash run_indexing.sh"))
    if idx_ok and asins is not None:
        out.append((len(asins) == n_docs, f"index documents {n_docs} vs deduplicated products {len(asins)}",
                    "" if len(asins) == n_docs else "rebuild the index after changing DEFAULT_FILE_PATH (the "
                    "1000-product index trap): cd search_engine && python convert_product_file_format.py && "
                    "bash run_indexing.sh"))
    sm = importlib.util.find_spec("en_core_web_sm") is not None
    out.append((sm, "spaCy model en_core_web_sm (goal.py loads it at import)",
                "" if sm else "python -m spacy download en_core_web_sm (setup.sh fetches en_core_web_lg instead)"))
    try:
        pv = version("pyserini")
    except PackageNotFoundError:
        pv = None
    jv = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr if shutil.which("java") else ""
    jm = re.search(r'version "(\d+)(?:\.(\d+))?', jv)
    java = (int(jm.group(2)) if jm and jm.group(1) == "1" else int(jm.group(1))) if jm else None
    need = 21 if pv and tuple(int(x) for x in pv.split(".")[:2]) >= (0, 35) else 11
    out.append((pv is not None, f"pyserini {pv or 'not installed'}", "" if pv else "pip install pyserini==0.17.0"))
    out.append((java is not None and java >= need, f"Java {java or 'not found'} (pyserini {pv or '?'} needs >= {need})",
                "" if java and java >= need else "install a JDK >= 11 and pyserini<=0.25 (0.35+ needs Java 21)"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("make-games", help="generate ALFWorld-format games offline")
    g.add_argument("--split", default="train", choices=["train", "valid_seen", "valid_unseen"])
    g.add_argument("--n", type=int, default=200)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True)
    g.add_argument("--workers", type=int, default=2)
    g.add_argument("--max_len", type=int, default=15, help="re-sample games whose walkthrough is longer")
    g.add_argument("--min_receptacles", type=int, default=6)
    g.add_argument("--max_receptacles", type=int, default=12)
    sub.add_parser("make-builtin", help=f"rebuild {os.path.relpath(BUILTIN_TAR, HERE)} ({BUILTIN})")
    s = sub.add_parser("stats", help="split sizes and expert-length distributions")
    s.add_argument("--games", default="builtin", choices=["builtin", "official", "webshop-lite"])
    sub.add_parser("webshop-doctor", help="check an official WebShop setup ($WEBSHOP_PATH): what is missing")
    a = ap.parse_args()
    if a.cmd == "make-games":
        from gamegen import make_games
        t0 = time.time()
        res = make_games(a.out, a.split, a.n, a.seed, a.workers, a.max_len, a.min_receptacles, a.max_receptacles)
        print(f"{len(res)} games in {time.time() - t0:.0f}s, {sum(r[3] for r in res)} draws re-sampled")
        print(length_table([{"task_type": tt, "L": L} for _, L, tt, _ in res]))
    elif a.cmd == "make-builtin":
        from gamegen import make_builtin
        make_builtin()
    elif a.cmd == "webshop-doctor":
        checks = webshop_doctor()
        for ok, what, fix in checks:
            print(f"[{'ok' if ok else 'MISSING'}] {what}" + (f"\n          fix: {fix}" if fix else ""))
        sys.exit(0 if all(ok for ok, _, _ in checks) else 1)
    else:
        try:
            if a.games == "webshop-lite":  # every goal of every split through the scripted expert
                env = WebShopEnv({"env": "webshop", "backend": "lite", "seed": 0, "products": 1000, "max_steps": 99})
                for split, (lo, hi) in WEBSHOP_SPLITS.items():
                    idx = range(lo, min(hi or len(env.goals), len(env.goals)))
                    res = [scripted_expert(env, i) for i in idx]
                    print(f"[envs] webshop-lite {split}: {len(idx)} goals, scripted expert reward 1 on "
                          f"{sum(s == 1.0 for _, s in res)}")
                    print(length_table([{"task_type": env.goals[i]["category"], "L": len(w)} for i, (w, _) in zip(idx, res)]))
                return
            for split in ("train", "valid_seen", "valid_unseen"):
                print(length_table(load_tasks(split, a.games, verbose=True)))
        except FileNotFoundError as e:  # one line, exit code 2, as train.py / eval.py
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main()

"""WebShop behind the episode interface of envs.py (reset(goal index, prefix) -> episode; step(ep, action) -> valid),
over two backends, plus what feeds them: the lite catalogue generator, the scripted expert, the goal splits and a
doctor for an official install.

    python envs.py webshop-doctor                       # what an official WebShop setup ($WEBSHOP_PATH) lacks
    python envs.py stats --games webshop-lite           # lite's splits and the scripted expert's success
    python train.py --env webshop [--webshop_backend official]

`official` drives the user's own princeton-nlp/WebShop checkout ($WEBSHOP_PATH, its web_agent_site text
environment); nothing of WebShop's code or data is in this repository. `lite` is this repo's own clean-room site
with the same action grammar, page flow and reward form over a generated catalogue (gamegen.make_catalogue),
searched with bm25s; lite numbers are labelled webshop-lite and are never WebShop numbers. Goals are indexed into
one fixed goal list and split by the paper's scheme (test 0-499, eval 500-1499, train 1500+) or the authors'.
"""
import collections
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys

from gamegen import fixed_price, make_catalogue

# ---------------------------------------------------------------------------------------------
# WebShop: one episode interface over two backends. `lite` is this repo's clean-room site over a generated
# catalogue (gamegen.make_catalogue); `official` drives the user's own princeton-nlp/WebShop checkout.
# Both render WebShop's text mode (' [SEP] '-joined page strings), take search[...] / click[...] actions, and
# report the raw reward (score in [0, 1]); won = (score == 1). Observations drop the instruction (it is the task).
# ---------------------------------------------------------------------------------------------
WEBSHOP_SPLITS = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)}  # paper: goal indices
AUTHORS_PRODUCTS = os.path.join("data", "items_shuffle_1000.json")  # --webshop_setting authors: env.webshop.use_small
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
            # the authors' setting: their 1,000-product file and synthetic goals (verl-agent's env.webshop.use_small,
            # human_goals: False [ZJU-REAL/Agent-G2 agent_system/environments/env_manager.py, make_envs]); human: the
            # catalogue utils.py names (the full set) and WebShop's human instructions
            human = spec.get("setting", "authors") == "human"
            files = {} if human else {"file_path": os.path.join(spec.get("path") or os.environ.get("WEBSHOP_PATH", ""),
                                                                  AUTHORS_PRODUCTS)}
            self.env = cls(observation_mode="text", num_products=None, human_goals=human, **files,
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


def load_webshop_tasks(split, spec, cache=None, expert_data="", verbose=False, only=None):
    """Tasks of a WebShop split (webshop_split_indices under spec['split'], paper by default: the goal-index
    ranges of WEBSHOP_SPLITS; ALFWorld's valid_* names mean 'eval').
    gamefile = the goal index. Evaluation splits keep every goal of their range (hint-free evaluation needs no
    walkthrough). The train split keeps the goals with a hint: the authors' expert entry of the goal's target key
    (expert_data, hints.py; with its thinks), else a reward-1 walkthrough of the scripted expert (for the official
    backend cached under `cache`, failures included, keyed by the goal list, since playing ~10k goals takes a
    while). only: a subset of goal indices to keep (a seeded sample, e.g. the contract test on a real install)."""
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
    walks, path = {}, None
    if spec["backend"] == "official" and name == "train":
        key = hashlib.sha1(json.dumps([(g["asin"], g["instruction_text"]) for g in env.goals]).encode()).hexdigest()
        path = os.path.join(cache or cache_dir(), f"webshop_official_experts_{key[:12]}.json")
        walks = {**({int(k): v for k, v in json.load(open(path)).items()} if os.path.exists(path) else {}), **walks}
    experts = {}
    if expert_data and name == "train":  # the goals an entry matches keep it; the others get the scripted expert
        from hints import attach_expert_data, read_expert_file
        matched, note = attach_expert_data([{"gamefile": i, "walkthrough": None} for i in idx],
                                           read_expert_file(expert_data), "webshop",
                                           key_of=lambda t: goal_target_key(env.goals[t["gamefile"]]))
        experts = {t["gamefile"]: t for t in matched if t["walkthrough"] is not None}
        if verbose:
            print(note)
    tasks = []
    for i in idx:
        if i in experts:
            tasks.append({"id": f"webshop-{spec['backend']}/{i}", "gamefile": i,
                          "task_type": env.goals[i].get("category", "webshop"), "walkthrough": experts[i]["walkthrough"],
                          "thinks": experts[i]["thinks"], "L": experts[i]["L"]})
            continue
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


def webshop_doctor(path="", setting="authors"):
    """Check an official WebShop setup for one setting; -> list of (ok, what, fix). Looks at files and versions,
    imports nothing heavy: the data paths utils.py sets (its uncommented lines), that they exist, that the attribute
    file covers the setting's product file (authors: data/items_shuffle_1000.json, which the wrapper passes; human:
    utils.py's DEFAULT_FILE_PATH, the full set), the search index's document count against the deduplicated product
    count (products are streamed, never loaded whole), the spaCy model, and Java against the installed pyserini."""
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
        if setting == "authors" and name == "DEFAULT_FILE_PATH":
            continue  # this setting passes its own product file (below)
        if name not in paths:
            if name in WEBSHOP_NEEDED:
                out.append((False, f"utils.py sets no {name}", "restore web_agent_site/utils.py from the checkout"))
            continue
        ok = os.path.exists(paths[name]) or name not in WEBSHOP_NEEDED
        out.append((ok, f"utils.py {name} -> {rel(paths[name])} ({what})" + ("" if os.path.exists(paths[name])
                                                                              else ", absent"),
                    "" if ok else "run ./setup.sh -d all (Google Drive via gdown), or point utils.py at your files"))
    prod = os.path.join(path, AUTHORS_PRODUCTS) if setting == "authors" else paths.get("DEFAULT_FILE_PATH", "")
    attr = paths.get("DEFAULT_ATTR_PATH", "")
    if setting == "authors":
        out.append((os.path.exists(prod), f"{AUTHORS_PRODUCTS} (the 1,000 products of the authors' setting)",
                    "" if os.path.exists(prod) else "run ./setup.sh -d small (or -d all), which fetches it"))
    asins = webshop_product_asins(prod) if os.path.exists(prod) else None
    if asins is not None:
        small = os.path.basename(prod) == "items_shuffle_1000.json" and setting == "human"
        out.append((True, f"{len(asins)} products after WebShop's deduplication in {rel(prod)}",
                    "the 1000-product preview; the human setting needs the full set: setup.sh -d all and point "
                    "DEFAULT_FILE_PATH at items_shuffle.json, DEFAULT_ATTR_PATH at items_ins_v2.json" if small else ""))
    if asins is not None and os.path.exists(attr):
        have = {k for k, v in iter_json_items(attr) if isinstance(v, dict) and "attributes" in v}
        miss = sum(a not in have for a in asins)
        out.append((miss == 0, f"attributes for {len(asins) - miss} of {len(asins)} products in {rel(attr)}",
                    "" if miss == 0 else f"the product and attribute files disagree: {miss} products get WebShop's "
                    "placeholder attribute DUMMY_ATTR, which changes the attribute reward and the expert's success; "
                    "point DEFAULT_ATTR_PATH at an attribute file that covers the setting's products (items_ins_v2.json "
                    "covers both sets, items_ins_v2_1000.json the 1,000 only)"))
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
                    "" if len(asins) == n_docs else "rebuild the index from this setting's product file (the index "
                    "must hold exactly the products the server loads): cd search_engine && python "
                    "convert_product_file_format.py && bash run_indexing.sh"))
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

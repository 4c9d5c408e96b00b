"""WebShop behind the episode interface of envs.py (reset(goal index, prefix) -> episode; step(ep, action) ->
valid), over two backends, plus what feeds them: the lite site and its catalogue generator, the scripted
expert, the goal splits and their tasks (load_webshop_tasks); webshop_doctor.py checks an official install.
`WebShopEnv` is also WebShop's entry in envs.ENVS (`--env webshop`): its worker spec, tasks, split names,
`envs.py stats` listing and the prompt's wording of the agent.

    python envs.py webshop-doctor                       # what an official WebShop setup ($WEBSHOP_PATH) lacks
    python envs.py stats --games webshop-lite           # lite's splits and the scripted expert's success
    python train.py --env webshop [--webshop_backend official]

`official` drives the user's own princeton-nlp/WebShop checkout ($WEBSHOP_PATH, its web_agent_site text
environment); nothing of WebShop's code or data is in this repository. `lite` is this repo's own clean-room
site with the same action grammar, page flow and reward form over a generated catalogue (make_catalogue,
below), searched with bm25s; lite numbers are labelled webshop-lite and are never WebShop numbers. Goals
are indexed into one fixed goal list and split by the paper's scheme (test 0-499, eval 500-1499, train
1500+) or the authors'.
"""
import collections
import functools
import hashlib
import json
import os
import random
import re
import sys


# ---------------------------------------------------------------------------------------------
# WebShop: one episode interface over two backends. `lite` is this repo's clean-room site over a generated
# catalogue (make_catalogue); `official` drives the user's own princeton-nlp/WebShop checkout.
# Both render WebShop's text mode (' [SEP] '-joined page strings), take search[...] / click[...] actions,
# and report the raw reward (score in [0, 1]); won = (score == 1). Observations drop the instruction (it
# is the task).
# ---------------------------------------------------------------------------------------------
WEBSHOP_SPLITS = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)}  # paper: goal indices
# --webshop_setting authors: env.webshop.use_small
AUTHORS_PRODUCTS = os.path.join("data", "items_shuffle_1000.json")
SEARCH_ACTION = "search[<query>]"  # the admissible form of a search; the query is free text
INVALID_PREFIX = "Invalid action. "  # shown before the unchanged page after an invalid step (WebShop: none)
RESULTS_PER_PAGE, SEARCH_K = 10, 50
# alphabetical, as WebShop's scan
COLORS = sorted(["black", "white", "navy", "blue", "red", "grey", "gray", "green", "olive", "pink", "silver",
                 "beige", "ivory", "teal", "brown", "purple", "yellow", "orange", "gold"])
STOPWORDS = set("a an and the for of to in on with by at from is are be i me my need want looking find get "
                "buy that this it its under than lower price dollars".split())


# WebShop engine.py get_top_n_product_from_keywords: commands
SPECIAL_QUERY_WORDS = {"<a>", "<q>", "<c>", "<r>"}


def parse_webshop_action(action):
    """'search[red mug]' -> ('search', 'red mug'); 'click[Buy Now]' -> ('click', 'buy now'); else None.
    Queries lose their brackets: WebShop's parse_action (engine.py, a greedy '(name)[(arg)]' match) reads
    'search[a [b]]' as the action 'search[a ' and then does nothing. A query whose first word is <a>, <q>, <c>
    or <r> is invalid: WebShop's engine.py (get_top_n_product_from_keywords) takes it as a command (<a> raises
    a TypeError, <q>/<c> filter by exact query/category, <r> samples at random), which the authors' projection
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
    """WebShop's get_available_actions (web_agent_text_env.py): the search bar only on the search page, then
    the page's buttons, product links and option values, in that order."""
    return ([SEARCH_ACTION] if has_search_bar else []) + [f"click[{c}]" for c in clickables
                                                          if clickable_ok(c)]


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


def attribute_matches(goal, product):
    """How many goal attributes the product has, as WebShop's goal.py get_attribute_reward counts them: a
    fuzzy match (> 85) with one of its attributes, else the attribute's text in its title, bullets or
    description."""
    title, desc = product["Title"].lower(), product["Description"].lower()
    bullets = " ".join(product["BulletPoints"]).lower()
    return sum(any(fuzzy_ratio(pa, a) > 85 for pa in product["Attributes"])
               or a in title or a in bullets or a in desc for a in goal["attributes"])


def webshop_reward(goal, product, options):
    """WebShop's reward (goal.py get_reward): (attribute matches + option matches + price ok) / (#attributes +
    #options + 1), times a type factor. product: {Title, BulletPoints, Description, Attributes, price, query,
    product_category}; options: the option values chosen. -> (reward, info). Fuzzy matches: fuzzy_ratio > 85.
    Options are scored as WebShop scores synthetic goals, by (name, value) pairs (goal_option_texts): a wrong
    size such as '24 pack' for '12 pack' (85.7 by value alone) no longer matches."""
    n_att = attribute_matches(goal, product)
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
    """The lite backend's site: normalised catalogue (WebShop's load semantics: Title, BulletPoints,
    lower-cased options with '/' -> ' | ', one price per product), a BM25 index over title + description +
    first bullet + option text (bm25s, Lucene scoring, k1 0.9, b 0.4, English stopwords, Snowball stems) and
    the shuffled goals. Page state is a small dict, so one site serves any number of concurrent episodes."""

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
        q = import_bm25s().tokenize([query], stopwords="en", stemmer=self.stemmer, show_progress=False,
                                    return_ids=False)[0]
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
            return (" [SEP] ".join(parts), False,
                    ["back to search"] + [x.lower() for x in nav] + [a.lower() for a in hits])
        q = self.products[st["asin"]]
        if kind == "item":
            # item_page.html in text mode: options (no mark on the chosen ones) before the title; the
            # clickables list the buttons first, then the option values (web_agent_text_env.py
            # get_available_actions: buttons + product links, then the radio inputs)
            parts = ["Back to Search", "< Prev"]
            for name, vals in q["options"].items():
                parts += [name] + vals
            parts += [q["Title"], f"Price: {q['Price']}", "Rating: N.A.", "Description", "Features",
                      "Reviews", "Buy Now"]
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
    """A raw pricing string as WebShop shows it (engine.py load_products): each '$' amount as a
    Python float, '$12.5' or '$12.5 to $20.0' for a range; the reward uses one hidden price inside
    the range (fixed_price)."""
    ends = [float(re.sub(r"[^\d.]", "", x)) for x in (pricing or "").split("$")[1:]][:2] or [100.0]
    return " to ".join(f"${x}" for x in ends)


def import_bm25s():
    """bm25s imports numba (so llvmlite) whenever it is installed; vLLM 0.32's CPU kernel dispatcher
    then trips over llvmlite's library wrapper while it scans sys.modules at engine start
    ("'_lib_fn_wrapper' object has no attribute 'get'"). We use bm25s's numpy scoring only, so numba is
    hidden while bm25s imports."""
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


def webshop_spec(cfg):
    """What an env worker needs to build the configured WebShop (the pool's spec; envs.env_spec)."""
    return {"env": "webshop", "backend": cfg.webshop_backend, "seed": cfg.webshop_seed,
            "products": cfg.webshop_products, "path": os.environ.get("WEBSHOP_PATH", ""),
            "max_steps": cfg.max_steps, "split": cfg.webshop_split, "setting": cfg.webshop_setting,
            "milestones": cfg.advantage == "beacon"}  # each step's BEACON milestone flag (Milestones)


def _official_env_class(path=""):
    """The user's WebShop text environment class. WEBSHOP_PATH (or `path`) is put on sys.path; the PyPI
    package `webshop` is a stub without it and is not used."""
    path = path or os.environ.get("WEBSHOP_PATH", "")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
    except ImportError as e:
        raise ImportError(f"official WebShop not importable ({e}). Set WEBSHOP_PATH to your "
                          "princeton-nlp/WebShop checkout and run `python envs.py webshop-doctor`; "
                          "or use --webshop_backend lite") from e
    return WebAgentTextEnv


_OFFICIAL_SERVER = {}


class WebShopEnv:
    """reset(goal index, prefix) / step(ep, action), the AlfEnv interface. spec: {"backend":
    "lite"|"official", "seed", "products", "path", "max_steps"}. Lite keeps the page state in the episode
    dict; official keeps it in its WebAgentTextEnv (one per concurrent episode, all sharing one SimServer:
    catalogue and index load once). The class is WebShop's entry in envs.ENVS (envs.Env has the interface)."""
    wording = ("a shopping agent in a web store", "For search[<query>], write the query yourself.")
    env_spec = staticmethod(webshop_spec)

    @classmethod
    def make_env(cls, spec):
        return cls(spec)

    @staticmethod
    def split_names(cfg):  # ALFWorld's valid_* names mean eval (load_webshop_tasks)
        return sorted(WEBSHOP_SPLITS) + ["valid_seen", "valid_unseen"]

    @staticmethod
    def tasks(cfg, split, verbose=False):
        return load_webshop_tasks(split, webshop_spec(cfg), cfg.cache_dir or None, cfg.expert_data, verbose)

    @classmethod
    def stats(cls, games=None):
        """-> [(line, tasks)] per split of webshop-lite: every goal through the scripted expert."""
        env = cls({"env": "webshop", "backend": "lite", "seed": 0, "products": 1000, "max_steps": 99})
        for split, (lo, hi) in WEBSHOP_SPLITS.items():
            idx = range(lo, min(hi or len(env.goals), len(env.goals)))
            res = [scripted_expert(env, i) for i in idx]
            yield (f"[envs] webshop-lite {split}: {len(idx)} goals, scripted expert reward 1 on "
                   f"{sum(s == 1.0 for _, s in res)}",
                   [{"task_type": env.goals[i]["category"], "L": len(w)} for i, (w, _) in zip(idx, res)])

    def __init__(self, spec):
        self.spec, self.gamefile = spec, None
        if spec["backend"] == "lite":
            self.site = lite_site(spec["seed"], spec["products"])
            self.goals = self.site.goals
        else:
            cls = _official_env_class(spec.get("path", ""))
            # the first env of the process builds the catalogue and goals
            if "server" not in _OFFICIAL_SERVER:
                # WebShop draws goal price caps from the global `random` before its shuffle
                random.seed(spec["seed"])
            # the session key is prefix + goal index, and the page state lives in the shared server under it:
            # every env object (one per concurrent episode) needs its own prefix, or R rollouts of a goal
            # share one page
            _OFFICIAL_SERVER["n"] = _OFFICIAL_SERVER.get("n", 0) + 1
            # the authors' setting: their 1,000-product file and synthetic goals (verl-agent's
            # env.webshop.use_small, human_goals: False
            # [ZJU-REAL/Agent-G2 agent_system/environments/env_manager.py, make_envs]); human: the catalogue
            # utils.py names (the full set) and WebShop's human instructions
            human = spec.get("setting", "authors") == "human"
            files = ({} if human else
                     {"file_path": os.path.join(spec.get("path") or os.environ.get("WEBSHOP_PATH", ""),
                                                AUTHORS_PRODUCTS)})
            self.env = cls(observation_mode="text", num_products=None, human_goals=human, **files,
                           server=_OFFICIAL_SERVER.get("server"),
                           session_prefix=f"g2-{os.getpid()}-{_OFFICIAL_SERVER['n']}-")
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
            # a Python int (made above): WebShop's reset and SimServer.receive (web_agent_text_env.py) pick
            # the goal only when isinstance(session, int); a NumPy integer silently got a random goal
            obs, _ = self.env.reset(session=gamefile)
            self._show(ep, _strip_instruction(obs), *self._official_actions())
        if self.spec.get("milestones"):  # BEACON: the milestone detector walks the episode from its start
            from plumbing.milestones import for_env
            ep["phases"] = for_env(self, goal, attribute_matches)
        for a in prefix:  # step() validates the action and appends (obs, a) to the history
            ep["prefix_steps"].append((ep["obs"], ep["admissible"], a))
            if not self.step(ep, a):
                raise RuntimeError(f"expert prefix action {a!r} is not admissible "
                                   f"for WebShop goal {gamefile}")
        return ep

    def _official_actions(self):
        av = self.env.get_available_actions()
        # our normalised text -> theirs
        self.click_as = {" ".join(c.lower().split()): c for c in av["clickables"]}
        return av["has_search_bar"], list(self.click_as)

    def _show(self, ep, obs, has_search, clicks):
        clicks = [c for c in clicks if clickable_ok(c)]
        ep.update(obs=obs, page_obs=obs, has_search=has_search, clickables=clicks,
                  admissible=webshop_admissible(has_search, clicks))

    def step(self, ep, action):
        """Invalid (unparseable, a special search word, not on this page, after the end or past max_steps):
        the page stays, the observation says so, and the step still counts. A search is valid from any page,
        as in WebShop's step (web_agent_text_env.py searches whenever the action is search[non-empty]),
        although the admissible list offers it on the search page only (WebShop's has_search_bar)."""
        valid = self._step(ep, action)
        if "phases" in ep:  # BEACON: every step is fed, valid or not, as the reference's wrapper feeds it
            ep["milestone"] = ep["phases"].step(action if isinstance(action, str) else "", ep["obs"])
        return valid

    def _step(self, ep, action):
        ep["history"].append((ep["obs"], action if isinstance(action, str) else ""))
        ep["steps"] += 1
        act = parse_webshop_action(action) if isinstance(action, str) else None
        ok = act is not None and not ep["done"] and ep["steps"] <= self.spec["max_steps"] and (
            act[0] == "search" or (act[0] == "click" and act[1] in ep["clickables"]))
        if not ok:
            ep["obs"] = INVALID_PREFIX + ep["page_obs"]
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
            official_arg = self.click_as.get(arg, arg) if kind == "click" else arg
            obs, reward, done, _ = self.env.step(f"{kind}[{official_arg}]")
            if done:
                ep["score"] = float(reward)
                self._finish(ep)
            else:
                self._show(ep, _strip_instruction(obs), *self._official_actions())
        return True

    def _finish(self, ep):
        ep.update(done=True, won=ep["score"] == 1.0)
        self._show(ep, ("Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] "
                        f"{ep['score']:.2f}"), False, [])


def _strip_instruction(obs):
    """WebShop text pages begin '[WebShop [SEP]] Instruction: [SEP] <instruction> [SEP] ...':
    keep the rest."""
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
            # 'Next >' is always shown
            last = m is None or int(m.group(1)) * RESULTS_PER_PAGE >= int(m.group(2))
            if target in ep["admissible"] or last or "click[next >]" not in ep["admissible"]:
                break
            act("click[next >]")
        if target in ep["admissible"]:
            break
        act("click[back to search]")
    act(target)
    want = goal["goal_options"].values() if isinstance(goal["goal_options"], dict) else goal["goal_options"]
    for v in want:
        opts = [c for c in ep["clickables"]
                if c not in ("back to search", "< prev", "description", "features", "reviews", "buy now")]
        if opts:
            act(f"click[{max(opts, key=lambda c: (c == v.lower(), fuzz.token_set_ratio(c, v.lower())))}]")
    act("click[buy now]")
    return acts, ep["score"]


def goal_target_key(goal):
    """(ASIN, sorted option values with counts), values lower-cased and space-normalised:
    how the authors' code tells WebShop goals apart and keys its expert data
    [ZJU-REAL/Agent-G2 gmsv/webshop.py goal_to_target_key]."""
    vals = goal.get("goal_options") or {}
    vals = vals.values() if isinstance(vals, dict) else vals
    return (str(goal.get("asin", "")).upper(),
            tuple(sorted(collections.Counter(" ".join(str(v).lower().split()) for v in vals).items())))


def webshop_split_indices(goals, name, scheme="paper"):
    """Goal indices of split `name` (test | eval | train). scheme 'paper': WebShop's baseline split, the
    ranges of WEBSHOP_SPLITS. scheme 'authors': the authors' code [ZJU-REAL/Agent-G2
    agent_system/environments/env_package/webshop/envs.py]: validation = the first 500 goals in order after
    dropping repeated (ASIN, options) goals (goal_target_key), used here for both test and eval; train = goals
    500+ (which may repeat a validation goal's key, as there by default)."""
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
    walkthrough). The train split keeps the goals with a hint: the authors' expert entry of the goal's target
    key (plumbing/expert_data; with its thinks), else a reward-1 walkthrough of the scripted expert (for the
    official backend cached under `cache`, failures included, keyed by the goal list, since playing ~10k goals
    takes a while). only: a subset of goal indices to keep (a seeded sample, e.g. the contract test on a real
    install)."""
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
        raise ValueError(f"WebShop {spec['backend']}: {len(env.goals)} goals, "
                         f"none in split {name} {lo}..{hi}")
    walks, path = {}, None
    if spec["backend"] == "official" and name == "train":
        goals_json = json.dumps([(g["asin"], g["instruction_text"]) for g in env.goals])
        key = hashlib.sha1(goals_json.encode()).hexdigest()
        if cache is None:
            from plumbing.gamegen import default_cache
            cache = default_cache()
        path = os.path.join(cache, f"webshop_official_experts_{key[:12]}.json")
        walks = {**({int(k): v for k, v in json.load(open(path)).items()} if os.path.exists(path) else {}),
                 **walks}
    experts = {}
    # the goals an entry matches keep it; the others get the scripted expert
    if expert_data and name == "train":
        from plumbing.expert_data import attach_expert_data, read_expert_file
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
                          "task_type": env.goals[i].get("category", "webshop"),
                          "goal": env.goals[i]["instruction_text"],
                          "walkthrough": experts[i]["walkthrough"],
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
        tasks.append({"id": f"webshop-{spec['backend']}/{i}", "gamefile": i,
                      "task_type": g.get("category", "webshop"), "goal": g["instruction_text"],
                      "walkthrough": walk, "L": len(walk)})
    if path:  # atomic: every rank writes the same content
        json.dump(walks, open(path + f".{os.getpid()}", "w"))
        os.replace(path + f".{os.getpid()}", path)
    if verbose:
        print(f"[envs] webshop-{spec['backend']} {name}: {len(tasks)} goals (indices {idx[0]}..{idx[-1]})")
    return tasks


# ---------------------------------------------------------------------------------------------
# The lite catalogue: seeded synthetic products in WebShop's raw product schema (asin, name,
# full_description, small_description, pricing, customization_options, category, query, product_category),
# the attribute file of items_ins_v2 (attributes, instruction, instruction_attributes) and synthetic goals
# (one per product x option combination, with a price cap). Generated here, never copied from WebShop.
# ---------------------------------------------------------------------------------------------
WEBSHOP_VOCAB = {  # category: (path, product types, attributes, {option name: values})
    "fashion": ("Clothing, Shoes & Jewelry › Men › Clothing",
                ["t-shirt", "hoodie", "jeans", "sweater", "sneakers", "rain jacket", "polo shirt", "shorts"],
                ["machine wash", "cotton", "slim fit", "long sleeve", "relaxed fit", "quick dry",
                 "button closure"],
                {"color": ["black", "white", "navy blue", "red", "grey", "olive green"],
                 "size": ["small", "medium", "large", "xl"]}),  # not 'x-large': WebShop's option score gives
    # 'large' full marks for a goal's ('size', 'x-large') (its tokens are a subset), so a wrong size would win
    "grocery": ("Grocery & Gourmet Food › Snacks & Beverages",
                ["coffee beans", "green tea", "protein bar", "trail mix", "granola", "hot sauce",
                 "almond butter"],
                ["gluten free", "sugar free", "low calorie", "non gmo", "organic", "keto friendly",
                 "high protein"],
                {"flavor": ["vanilla", "chocolate", "original", "sea salt", "cinnamon", "berry"],
                 "size": ["6 pack", "12 pack", "24 pack"]}),
    "beauty": ("Beauty & Personal Care › Skin Care",
               ["shampoo", "face cream", "lip balm", "body lotion", "sunscreen", "hair oil", "face wash"],
               ["paraben free", "long lasting", "sensitive skin", "natural ingredients", "cruelty free",
                "fragrance free", "dry skin"],
               {"scent": ["lavender", "coconut", "unscented", "citrus", "rose"],
                "size": ["2 ounce", "8 ounce", "16 ounce"]}),
    "electronics": ("Electronics › Accessories & Supplies",
                    ["hdmi cable", "phone case", "wireless earbuds", "usb charger", "power bank", "keyboard",
                     "webcam"],
                    ["fast charging", "high speed", "water resistant", "easy install", "noise cancelling",
                     "plug and play", "long battery life"],
                    {"color": ["black", "white", "silver", "blue", "pink"],
                     "style": ["3 feet", "6 feet", "10 feet", "2 pack"]}),
    "home": ("Home & Kitchen › Bedding & Decor",
             ["throw pillow", "blackout curtain", "bath towel", "scented candle", "area rug", "table lamp",
              "storage basket"],
             ["easy clean", "machine washable", "living room", "eco friendly", "non slip", "bedroom",
              "super soft"],
             {"color": ["beige", "dark grey", "ivory", "teal", "brown", "black"],
              "size": ["small", "medium", "large", "queen", "king"]}),
}
WEBSHOP_BRANDS = ["acme", "northwind", "lumo", "brightly", "orchard", "kestrel", "tidewater", "foxglove",
                  "ironbark", "meadow", "pinecrest", "solace", "vantage", "willow", "zephyr"]
WEBSHOP_STYLES = ["classic", "premium", "everyday", "deluxe", "essential", "modern", "compact", "ultra"]
WEBSHOP_ASKS = ["i need {a} {t}", "i am looking for {a} {t}", "find me {a} {t}", "i want to buy {a} {t}",
                "get me {a} {t}"]


def fixed_price(product):
    """A product's price: its single price, or a point of its range fixed once per product (as WebShop fixes
    range prices at load), so goals and the site agree on it."""
    ends = [float(x.strip(" -")) for x in product["pricing"].split("$")[1:]] or [100.0]
    return ends[0] if len(ends) == 1 else round(random.Random(product["asin"]).uniform(ends[0], ends[1]), 2)


def make_catalogue(seed=0, n_products=1000):
    """-> (products [raw WebShop schema], attributes {asin: items_ins_v2 entry}, goals [synthetic, shuffled]).
    Deterministic for (seed, n_products): one RNG, no global state."""
    rng = random.Random(f"webshop-lite/{seed}/{n_products}")
    products, attrs, asins = [], {}, set()
    cats = sorted(WEBSHOP_VOCAB)
    for i in range(n_products):
        cat = cats[i % len(cats)]
        path, types, pool, opts = WEBSHOP_VOCAB[cat]
        while True:
            asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
            if asin not in asins:
                asins.add(asin)
                break
        ptype, a = rng.choice(types), rng.sample(pool, rng.randint(2, 3))
        name = f"{rng.choice(WEBSHOP_BRANDS).title()} {rng.choice(WEBSHOP_STYLES).title()} {a[0].title()} " \
               f"{ptype.title()}"
        lo = round(rng.uniform(5, 120), 2)
        pricing = (f"${lo:.2f}" if rng.random() < 0.7
                   else f"${lo:.2f} - ${lo + round(rng.uniform(2, 30), 2):.2f}")
        options = {}
        for oname in sorted(rng.sample(sorted(opts), rng.randint(0, 2))):
            options[oname] = [{"value": v, "image": None} for v in rng.sample(opts[oname], rng.randint(2, 3))]
        products.append({
            "asin": asin, "name": name, "category": cat, "query": ptype,
            "product_category": f"{path} › {ptype.title()}",
            "full_description": f"This {ptype} is {' and '.join(a[1:])}. Made by {name.split()[0]}.",
            "small_description": [f"{x.capitalize()}." for x in a[1:]] + [f"Great {ptype} for every day."],
            "pricing": pricing, "customization_options": options or None, "images": [None]})
        ask = rng.choice(WEBSHOP_ASKS).format(a=" and ".join(a), t=ptype)
        attrs[asin] = {"attributes": a, "instruction": ask, "instruction_attributes": a}
    goals = []
    for p in products:
        price = fixed_price(p)
        combos = [{}]
        for oname, vals in (p["customization_options"] or {}).items():
            combos = [{**c, oname: v["value"]} for c in combos for v in vals]
        for combo in combos:
            caps = [10 * (int(price // 10) + k) for k in range(1, 5)]  # next four multiples of 10
            cap = max(rng.sample(caps, 2))
            inst = attrs[p["asin"]]["instruction"]
            text = (inst + (" with " + ", and ".join(f"{k}: {v}" for k, v in combo.items()) if combo else "")
                    + f", and price lower than {cap:.2f} dollars")
            goals.append({"asin": p["asin"], "category": p["category"], "query": p["query"],
                          "name": p["name"], "product_category": p["product_category"],
                          "instruction_text": text, "attributes": attrs[p["asin"]]["instruction_attributes"],
                          "goal_options": combo, "price_upper": float(cap)})
    rng.shuffle(goals)  # goal i is a stable id: the order depends only on (seed, n_products)
    return products, attrs, goals

"""Fake `web_agent_site.envs.web_agent_text_env` (see ../../README.md): the documented interface only.
Like WebShop, the page state of an episode lives in the shared server under the key session_prefix + session,
goal price caps are drawn from the global `random` before the goal list is shuffled with seed 233, and an
invalid action is a no-op."""
import random
import re
import string

from plumbing import webshop as g2  # this repo's plumbing/webshop.py: catalogue, pages, reward


class SimServer:
    def __init__(self, num_products=None, human_goals=True):
        """human_goals (WebShop's flag): human goals, with list-valued goal_options; else synthetic goals, one per
        product x option combination, with dict-valued goal_options (engine/goal.py get_synthetic_goals)."""
        self.site = g2.LiteSite(0, 520)
        goals = []
        for gl in self.site.goals:
            cap = gl["price_upper"] + 10 * random.randint(0, 3)  # global random, unseeded here, as in WebShop
            options = list(gl["goal_options"].values()) if human_goals else dict(gl["goal_options"])
            goals.append(dict(gl, goal_options=options, price_upper=cap,
                              instruction_text=gl["instruction_text"].rsplit(", and price", 1)[0] +
                              f", and price lower than {cap:.2f} dollars"))
        random.seed(233)  # like WebShop: the goal order depends only on the number of goals
        random.shuffle(goals)
        self.goals, self.user_sessions = goals, {}
        # engine.py load_products' lookups: asin -> product, asin -> the one price the reward uses
        self.product_item_dict = self.site.products
        self.product_prices = {a: p["price"] for a, p in self.site.products.items()}


class WebAgentTextEnv:
    def __init__(self, observation_mode="html", file_path=None, server=None, session_prefix=None, **kwargs):
        assert observation_mode == "text", "the fake renders text mode only"
        self.file_path = file_path  # WebShop loads its products from it; the fake builds its own catalogue
        self.server = server or SimServer(kwargs.get("num_products"), kwargs.get("human_goals", True))
        self.session_prefix, self.kwargs = session_prefix or "", kwargs
        self.reset()  # like WebShop's constructor: a session with a random name and goal

    def reset(self, session=None, instruction_text=None):
        """Like WebShop's reset + SimServer.receive: the goal is goals[session] only for a Python int (a NumPy
        integer gets a random one); a session that exists keeps its goal; the page goes back to search."""
        name = str(session) if session is not None else "".join(random.choices(string.ascii_lowercase, k=10))
        self.session = f"{self.session_prefix}{name}"
        if self.session not in self.server.user_sessions:
            idx = session if isinstance(session, int) else random.randrange(len(self.server.goals))
            self.server.user_sessions[self.session] = {"goal": self.server.goals[idx]}
        self._s["state"] = {"kind": "search"}
        return self.observation, None

    @property
    def _s(self):
        return self.server.user_sessions[self.session]

    @property
    def observation(self):
        text = self.server.site.view(self._s["state"])[0]
        head = ["WebShop"] if self._s["state"]["kind"] == "search" else []
        return " [SEP] ".join(head + ["Instruction:", self._s["goal"]["instruction_text"], text])

    def get_available_actions(self):
        _, has_search, clicks = self.server.site.view(self._s["state"])
        return {"has_search_bar": has_search, "clickables": clicks}

    def _search(self, keywords):
        """WebShop's special first words are commands; <a> reads an attribute table that is never passed."""
        site = self.server.site
        if keywords[0] == "<a>":
            raise TypeError("'NoneType' object is not subscriptable")
        if keywords[0] == "<r>":
            return random.sample(site.asins, min(50, len(site.asins)))
        if keywords[0] == "<q>":
            return [a for a in site.asins if site.products[a]["query"] == " ".join(keywords[1:]).strip()]
        if keywords[0] == "<c>":
            return [a for a in site.asins if keywords[1].strip() in site.products[a]["product_category"].lower()]
        return site.search(" ".join(keywords))

    def step(self, action):
        """WebShop's step: a greedy 'name[arg]' parse from the start of the string (so 'search[a [b]]' is the
        action 'search[a ' and does nothing), a search from any page, a click on a listed clickable; anything
        else is a no-op."""
        m = re.match(r"(.+)\[(.+)\]", action)
        name, arg = m.groups() if m else (action, None)
        arg = arg.lower() if arg is not None else None
        av = self.get_available_actions()
        st = self._s["state"]
        if name == "search" and arg:
            self._s["state"] = {"kind": "results", "query": arg, "results": self._search(arg.split(" ")), "page": 1}
        elif name == "click" and arg in av["clickables"] and arg != "search":
            if arg == "buy now":
                product = self.server.site.products[st["asin"]]
                self.last_reward = g2.webshop_reward(self._s["goal"], product, list(st["options"].values()))[0]
                return "Thank you for shopping with us!", self.last_reward, True, None
            self._s["state"] = self.server.site.move(st, "click", arg)
        return self.observation, 0.0, False, None

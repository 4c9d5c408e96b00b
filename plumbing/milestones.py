"""BEACON's WebShop milestones: a detector that walks an episode's four phases (search, detail, options,
purchase) over the goal and the catalogue, run in the env worker at every step (plumbing/webshop.py,
WebShopEnv.step, when the advantage estimator is beacon) so that each step row carries its `milestone` flag.

    m = Milestones(goal, products, prices)     # at reset; products: asin -> {"Title", ..., "options"}
    reached = m.step(action, next_observation)  # after every step, valid or not -> bool
"""
import re


class Milestones:
    """BEACON's four WebShop milestones, walked in order, one at most per step: (1) search: a search whose
    first results page lists a product that can meet the goal; (2) detail: a click on such a product; (3)
    options: every goal option value clicked (skipped for a goal without options); (4) purchase: buy now with
    that product and every goal option selected. "Can meet": every goal attribute matched (attribute_count),
    every goal option value among its options, price <= price_upper. Every step is fed, valid or not, as the
    reference's env wrapper feeds its detector [ZJU-REAL/BEACON migpo/webshop_milestone_detector.py
    (MilestoneDetector.process and the _process_*_phase handlers),
    agent_system/environments/env_package/webshop/envs.py (step, reset)]. step(action, next page) -> whether
    this step reached the next milestone (the row's `milestone` flag: variants/advantages.py BEACON). The
    reference's purchase check also accepts WebShop's verbose reward (r_att, r_price, r_option all 1), read
    from the session after the episode ends; WebShop's step has reset to a new session by then, so it reads
    None and that branch never runs: it is left out here."""
    ASIN = re.compile(r"\b([A-Z0-9]{10})\b")
    PHASES = ("search", "detail", "options", "purchase", "complete")

    def __init__(self, goal, products, prices, attribute_count):
        # asin -> product ({"options": {name: [values]}, ...}), asin -> price
        self.products, self.prices = products, prices
        self.attribute_count = attribute_count  # (goal, product) -> its goal attributes matched
        self.goal, self.n_att = goal, len(goal.get("attributes", []))
        opts = goal.get("goal_options")
        vals = opts.values() if isinstance(opts, dict) else (opts or [])
        self.want = {self.norm(v) for v in vals if v}  # the goal's option values
        self.phase, self.asin, self.chosen = "search", None, set()

    @staticmethod
    def norm(text):
        return re.sub(r"\s+", " ", text.strip().lower())

    def step(self, action, next_obs):
        """-> whether this step reached the next milestone."""
        if self.phase == "complete":
            return False
        # WebShop's engine.py parse_action, as the reference's detector reads an action: 'name[arg]', greedy
        m = re.match(r"(.+)\[(.+)\]", action)
        kind, arg = (m.group(1).lower(), m.group(2)) if m else (action.lower(), "")
        done = False
        if self.phase == "search":
            done = kind == "search" and "Page 1 (Total results" in next_obs and any(
                self.can_meet(a) for a in self.ASIN.findall(next_obs))
        elif self.phase == "detail":
            if kind == "click" and len(arg) == 10 and self.can_meet(arg.upper()):
                done, self.asin = True, arg.upper()
                if not self.want:  # no options to choose: the options milestone is skipped
                    self.phase = "options"
        elif self.phase == "options":
            if not self.want:
                done = True
            elif kind == "click":
                value = self.norm(arg)
                said = next_obs.lower().split("you have clicked", 1)
                if value not in self.want and len(said) > 1:  # WebShop's confirmation text, if shown
                    value = said[1].strip().split(".")[0].strip()
                if value in self.want:
                    self.chosen.add(value)
                done = self.want <= self.chosen
        else:  # purchase
            if action.lower() == "click[buy now]" and self.asin:
                done = self.satisfied(self.asin)
        if done:
            self.phase = self.PHASES[self.PHASES.index(self.phase) + 1]
        return done

    def can_meet(self, asin):
        product = self.products.get(asin)
        if product is None or self.attribute_count(self.goal, product) < self.n_att:
            return False
        have = {self.norm(v) for vals in (product.get("options") or {}).values() for v in vals}
        return self.want <= have and self.price_ok(asin)

    def satisfied(self, asin):  # at purchase: the chosen options, not the ones on offer
        product = self.products.get(asin)
        return (product is not None and self.attribute_count(self.goal, product) >= self.n_att
                and self.want <= self.chosen and self.price_ok(asin))

    def price_ok(self, asin):
        cap = self.goal.get("price_upper", 0)
        return cap <= 0 or self.prices.get(asin, float("inf")) <= cap


def for_env(env, goal, attribute_matches):
    """A Milestones detector for a WebShopEnv's goal over its backend's catalogue: lite's products and prices
    with lite's attribute_matches; the official server's product_item_dict and product_prices, with WebShop's
    own get_attribute_reward."""
    if env.spec["backend"] == "lite":
        products = env.site.products
        return Milestones(goal, products, {a: p["price"] for a, p in products.items()}, attribute_matches)
    from web_agent_site.engine.goal import get_attribute_reward
    server = env.env.server
    return Milestones(goal, server.product_item_dict, server.product_prices,
                      lambda g, p: get_attribute_reward(p, g)[1])

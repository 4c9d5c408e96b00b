"""Fake `web_agent_site.engine.goal` (see ../../README.md): get_attribute_reward(product, goal) ->
(share of the goal's attributes the product has, how many), WebShop's count: a fuzzy match (> 85) with one of the
product's attributes, else the attribute's text in its title, bullets or description (this repo's
plumbing/webshop.attribute_matches, which copies it)."""
from plumbing import webshop as g2


def get_attribute_reward(purchased_product, goal):
    n = g2.attribute_matches(goal, purchased_product)
    return n / max(len(goal["attributes"]), 1), n

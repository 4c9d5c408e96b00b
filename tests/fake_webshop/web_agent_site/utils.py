"""Fake `web_agent_site.utils` (see ../README.md): only the data path names the doctor reads, set to WebShop's
defaults (the 1000-product preview files); the fake itself reads none of them."""
from os.path import abspath, dirname, join

BASE_DIR = dirname(abspath(__file__))
DEFAULT_ATTR_PATH = join(BASE_DIR, '../data/items_ins_v2_1000.json')
DEFAULT_FILE_PATH = join(BASE_DIR, '../data/items_shuffle_1000.json')
HUMAN_ATTR_PATH = join(BASE_DIR, '../data/items_human_ins.json')

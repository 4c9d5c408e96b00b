"""What an official WebShop setup lacks, per setting:
`python envs.py webshop-doctor [--setting authors|human]`.

Reads files and versions only (nothing of WebShop is imported): the data paths `web_agent_site/utils.py` sets,
the product and attribute files each setting loads (streamed, never loaded whole), the search index against
the deduplicated product count, the spaCy model, and Java against the installed pyserini. webshop.py drives
the environment; docs/webshop.md has the setup.
"""
import json
import os
import re
import shutil
import subprocess

from plumbing.webshop import AUTHORS_PRODUCTS

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
    """{name: absolute path} for the data paths in WebShop's web_agent_site/utils.py, as Python binds them:
    the last assignment that is not commented out (WebShop's README has users leave the *_1000 lines commented
    above the full ones). Paths are join(BASE_DIR, '<relative>') there, BASE_DIR being web_agent_site/."""
    utils = os.path.join(path, "web_agent_site", "utils.py")
    base, out = os.path.dirname(utils), {}
    for line in open(utils) if os.path.exists(utils) else []:
        code = line.split("#", 1)[0]
        m = re.match(r"\s*([A-Z_]+)\s*=(.*)", code)
        strs = (re.findall(r"['\"]([^'\"]*)['\"]", m.group(2))
                if m and m.group(1) in WEBSHOP_DATA_PATHS else [])
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
    """The ASINs WebShop's load_products keeps, in order: it skips 'nan', ASINs over 10
    characters and repeats."""
    seen = {}
    for p in iter_json_items(path):
        a = p.get("asin") if isinstance(p, dict) else None
        if isinstance(a, str) and a != "nan" and len(a) <= 10:
            seen.setdefault(a, None)
    return list(seen)


def webshop_doctor(path="", setting="authors"):
    """Check an official WebShop setup for one setting; -> list of (ok, what, fix). Looks at files and
    versions, imports nothing heavy: the data paths utils.py sets (its uncommented lines), that they exist,
    that the attribute file covers the setting's product file (authors: data/items_shuffle_1000.json, which
    the wrapper passes; human: utils.py's DEFAULT_FILE_PATH, the full set), the search index's document count
    against the deduplicated product count (products are streamed, never loaded whole), the spaCy model, and
    Java against the installed pyserini."""
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
                out.append((False, f"utils.py sets no {name}",
                            "restore web_agent_site/utils.py from the checkout"))
            continue
        ok = os.path.exists(paths[name]) or name not in WEBSHOP_NEEDED
        out.append((ok, f"utils.py {name} -> {rel(paths[name])} ({what})" + ("" if os.path.exists(paths[name])
                                                                              else ", absent"),
                    "" if ok else ("run ./setup.sh -d all (Google Drive via gdown), "
                                   "or point utils.py at your files")))
    prod = (os.path.join(path, AUTHORS_PRODUCTS) if setting == "authors"
            else paths.get("DEFAULT_FILE_PATH", ""))
    attr = paths.get("DEFAULT_ATTR_PATH", "")
    if setting == "authors":
        out.append((os.path.exists(prod), f"{AUTHORS_PRODUCTS} (the 1,000 products of the authors' setting)",
                    "" if os.path.exists(prod) else "run ./setup.sh -d small (or -d all), which fetches it"))
    asins = webshop_product_asins(prod) if os.path.exists(prod) else None
    if asins is not None:
        small = os.path.basename(prod) == "items_shuffle_1000.json" and setting == "human"
        out.append((True, f"{len(asins)} products after WebShop's deduplication in {rel(prod)}",
                    "the 1000-product preview; the human setting needs the full set: setup.sh -d all and "
                    "point DEFAULT_FILE_PATH at items_shuffle.json, DEFAULT_ATTR_PATH at items_ins_v2.json"
                    if small else ""))
    if asins is not None and os.path.exists(attr):
        have = {k for k, v in iter_json_items(attr) if isinstance(v, dict) and "attributes" in v}
        miss = sum(a not in have for a in asins)
        out.append((miss == 0, f"attributes for {len(asins) - miss} of {len(asins)} products in {rel(attr)}",
                    "" if miss == 0 else f"the product and attribute files disagree: {miss} products get "
                    "WebShop's placeholder attribute DUMMY_ATTR, which changes the attribute reward and the "
                    "expert's success; point DEFAULT_ATTR_PATH at an attribute file that covers the "
                    "setting's products (items_ins_v2.json covers both sets, "
                    "items_ins_v2_1000.json the 1,000 only)"))
    # the text env (num_products=None) searches search_engine/indexes, built from resources/documents.jsonl,
    # one line per product that load_products keeps
    # (search_engine/convert_product_file_format.py, run_indexing.sh)
    docs = os.path.join(path, "search_engine", "resources", "documents.jsonl")
    n_docs = sum(1 for _ in open(docs)) if os.path.exists(docs) else 0
    index = os.path.join(path, "search_engine", "indexes")
    idx_ok = os.path.isdir(index) and bool(os.listdir(index)) and n_docs > 0
    out.append((idx_ok, f"search_engine/indexes ({n_docs} documents in resources/)",
                "" if idx_ok else ("cd search_engine && python convert_product_file_format.py "
                                   "&& bash run_indexing.sh")))
    if idx_ok and asins is not None:
        out.append((len(asins) == n_docs, f"index documents {n_docs} vs deduplicated products {len(asins)}",
                    "" if len(asins) == n_docs else "rebuild the index from this setting's product file "
                    "(the index must hold exactly the products the server loads): cd search_engine && python "
                    "convert_product_file_format.py && bash run_indexing.sh"))
    sm = importlib.util.find_spec("en_core_web_sm") is not None
    out.append((sm, "spaCy model en_core_web_sm (goal.py loads it at import)",
                "" if sm else ("python -m spacy download en_core_web_sm "
                               "(setup.sh fetches en_core_web_lg instead)")))
    try:
        pv = version("pyserini")
    except PackageNotFoundError:
        pv = None
    jv = (subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
          if shutil.which("java") else "")
    jm = re.search(r'version "(\d+)(?:\.(\d+))?', jv)
    java = (int(jm.group(2)) if jm and jm.group(1) == "1" else int(jm.group(1))) if jm else None
    need = 21 if pv and tuple(int(x) for x in pv.split(".")[:2]) >= (0, 35) else 11
    out.append((pv is not None, f"pyserini {pv or 'not installed'}",
                "" if pv else "pip install pyserini==0.17.0"))
    out.append((java is not None and java >= need,
                f"Java {java or 'not found'} (pyserini {pv or '?'} needs >= {need})",
                "" if java and java >= need
                else "install a JDK >= 11 and pyserini<=0.25 (0.35+ needs Java 21)"))
    return out

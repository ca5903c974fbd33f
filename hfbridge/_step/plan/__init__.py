"""The plan: a call's options resolved once into the chain it runs.

The registry (`option_table`: one row per option, HF's in `hf_option_rows`, the community samplers' built by
`community_options`; `option_docs` lists them in docstrings), the processors built in HF's order
(`build_processors`, `sampler_order` for llama.cpp's `--samplers`), one value per row (`per_row`), the
thinking phases' options (`phase_options`), the options an engine request may carry (`engine_requests`), and
what the options name: token strings (`token_text`), the real vocabulary (`padded_vocab`), guidance, watermark
and prefix constraints (`guidance_processor`, `watermark`, `prefix_fn`), and how a chain is shown
(`processor_repr`).

>>> from hfbridge._step.plan.build_processors import make_generation_config
>>> make_generation_config(None, top_k=5).do_sample
True
"""

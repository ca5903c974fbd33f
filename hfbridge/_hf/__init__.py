"""The one place that knows transformers' private surface.

hfbridge runs transformers' own helpers and loops on stand-in hosts, so that its results are HF's by
construction on every supported release (4.46.3 to 5.x; the lines CI runs are in docs/versions.md).
Every private name, signature, field and loop contract it relies on is reached through this package;
a release that changes one is found here, and a change that would decide correctness is checked
(`contracts.TransformersContractError`, naming the version and the contract) instead of giving a
wrong token.

Modules: `names` (renamed names and conventions, by version), `contracts` (the checks), `host`
(`ProcessorHost`: `GenerationMixin`'s helpers without a model; `AssistantStandIn`), `loops` (the beam and
assisted loops, candidate generators), `outputs` (HF's output classes), `caches` (`Cache`),
`integrations` (DeepSpeed / FSDP tests), `custom_generate` (what `generate(custom_generate=...)` hands a decoding function), `tokenizer_decode` (a fast tokenizer's
`tokenizers` decode, for banned strings). Imports: transformers and torch only.

| what hfbridge uses (private unless noted) | where | versions | on each side of the change | guard |
| --- | --- | --- | --- | --- |
| cache key in loops' `model_kwargs`, in `prepare_inputs_for_generation(...)`, in `assistant_model.generate(...)` | `names.LOOP_CACHE` | `past_key_values` < 5.24 <= `cache` | hosts pass and read the installed name | run time: `beam-reorder`, `assisted-cache`, `draft-cache` |
| cache field of `CausalLMOutputWithPast`, `GenerateDecoderOnlyOutput`, `GenerateBeamDecoderOnlyOutput` (public classes, renamed field) | `names.OUTPUT_CACHE`, `outputs` | `past_key_values` < 5.24 <= `cache` (old name: a property that logs a deprecation) | outputs built and replaced under the installed field only | first use: `output-fields` |
| `GenerationMixin._beam_search` | `loops.run_beam_search` | with `BeamSearchScorer` (public in 4.x) 4.46-4.49; vectorized 4.50+; reads `config.vocab_size` before its first call 4.50+ | scorer built as 4.x's `generate` builds it; the prompt's call is made first (`LoopHost.prefill_early`) so `vocab_size` is known | first use: `loop-signature`; run time: `beam-first-call` (the loop's first call is the prompt already run), `beam-reorder` (the loop reorders the host's cache once between model calls) |
| `GenerationMixin._assisted_decoding`, `_get_candidate_generator` | `loops.run_assisted_decoding`, `loops.candidate_generator` | generator built by `generate` and passed in (4.46 to at least 4.50) or built by the loop (4.57, 5.x) | both call forms | first use: `loop-signature`; run time: `assisted-crop` (the caches hold no rejected draft token at the next call), `assisted-cache` |
| `Cache.crop` convention | `names.CROP_TAKES_REMOVED`, `names.crop_keeps`, `caches.crop_hf_cache` | a length to keep (`crop(max_length)`, negative: all but the last n) <= 5.16, and the loop passes a length <= 5.13, `-n` only on rejection 5.14+; minus the positions to remove (`crop(tokens_to_remove)`) 5.17+, as a 0-d tensor | read from `DynamicCache.crop`'s signature | run time: `assisted-crop` (a length under the removal convention) |
| `PromptLookupCandidateGenerator`: `vocab_size`, `eos_token_id`, `num_output_tokens`, `__init__(logits_processor)` | `loops.prepare_prompt_lookup`, `loops.lookup_screens_candidates` | screens candidates with processors 5.x; fails on `eos_token_id=None` 4.x | width set from the logits; an empty eos tensor | parity tests (`tests/generate/test_assisted.py`) |
| `AssistedCandidateGenerator` asks the assistant for `_get_initial_cache_position`, `prepare_inputs_for_generation` (5.0), `_supports_logits_to_keep`, `_supports_num_logits_to_keep` | `host.AssistantStandIn` | 5.0 calls the first two on its first draft | pass-through | `draft-cache` (the cache must come back) |
| `_prepare_generation_config`, `_prepare_special_tokens` (`batch_size` in 5.x), `_get_logits_processor`, `_get_stopping_criteria`, `_prepare_generated_length` ("has default" rules differ 4.x / 5.x), `_prepare_attention_mask_for_generation` (config or pad/eos tensors), `_validate_generated_length`, `compute_transition_scores` (reads `config.vocab_size`) | `host.ProcessorHost` | all; signatures read with `inspect.signature` | the call form of the installed version | parity tests of every option (`tests/generate/test_generate_parity.py`, `tests/step/test_step.py`) |
| `GenerationConfig._eos_token_tensor`, `_pad_token_tensor` | `host.special_token` | all | read, never written | parity tests |
| host attributes HF's loops read: `config` (`vocab_size`, `is_encoder_decoder`), `generation_config`, `device`, `_is_stateful`, `_optimize_model_for_decode` (5.24), `_valid_auto_compile_criteria` (5.x) | `host.ProcessorHost`, `host.fresh_config` | as listed | a private config per host; no-op decode context; never compiled | parity tests on every line (docs/versions.md) |
| `Cache`, `DynamicCache` (public classes), `Cache.reorder_cache`, `get_seq_length`, `activate_past_recording` (5.x) | `caches` | all | the assisted hosts' cache is a `DynamicCache` (4.x checks `isinstance`) | `assisted-crop` |
| `prepare_inputs_for_generation`'s call protocol (`cache_position` 4.x; `next_sequence_length`, `is_first_iteration` 5.x), `_update_model_kwargs_for_generation`, `_prepare_cache_for_generation`, `_reorder_cache`, `_is_stateful` | `model_inputs` | all; read from `GenerationMixin`'s signature | passed as the installed `generate` passes them | run time: `model-inputs` (no whole sequence again on top of a cache) |
| `Cache.is_croppable`, `is_linear`, layers' `record_past`, `is_sliding` (5.x) | `caches.is_croppable`, `caches.forgets_past`, `model_inputs` | 5.x (absent in 4.x: every cache can be cropped) | read where they exist | `CacheTypeError` naming the hook |
| `PreTrainedTokenizerFast._decode` (compared, never called), `backend_tokenizer` (public) | `tokenizer_decode.backend_decode` | 4.46 to 5.x: `decode` -> `_decode` -> `backend_tokenizer.decode(ids, skip_special_tokens)`, then the clean-up of spaces when set | the `tokenizers` decode only for a class that keeps both methods and cleans up nothing | `tests/hf/test_tokenizer_decode.py` (the same text) |
| `transformers.integrations.deepspeed.is_deepspeed_zero3_enabled`, `integrations.fsdp.is_fsdp_managed_module` | `integrations.is_sharded` | all | HF's own test for `synced_gpus` | `tests/generate/test_loop.py` |
| `generate(custom_generate=callable)`: the call (`model, input_ids, logits_processor=, stopping_criteria=, generation_config=, **model_kwargs`), the callable's own keywords popped by its signature against `_sample`'s, `tokenizer` / `streamer` / `assistant_model` not passed; the folder form's arguments | `custom_generate` | callable 4.56+, its keywords 4.57+; folder 4.52+ | refused below `CALLABLE_KEYWORDS_SINCE`, naming the version | `tests/generate/test_custom_generate.py` |

>>> from hfbridge._hf.stand_in import ProcessorHost
>>> ProcessorHost().device.type
'cpu'
"""

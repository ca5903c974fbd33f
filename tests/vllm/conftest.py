"""vLLM tests. The engine tests skip where vLLM is not installed (`needs_vllm`); the batch tests run everywhere."""

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # a small KV cache on a shared CPU
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

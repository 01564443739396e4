"""python -m actors.engine {info,score,generate,make-tiny,bench} — checkpoint tools."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from actors.cli import dispatch, error

from .settings import compile_mode, kernel_mode


def _dtype_arg(p: argparse.ArgumentParser, default: str = "auto") -> None:
    p.add_argument(
        "--dtype",
        default=default,
        help="float32 | float64 | bfloat16 | float16 | auto (bench: a comma list runs each side by side)",
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")


def cmd_info(args) -> int:
    from ..precision import DtypeChoice
    from .loader import load_model

    lm = load_model(args.checkpoint, device=args.device, dtype=args.dtype)
    c = lm.config
    params = sum(p.numel() for p in lm.model.parameters())
    elem = lm.model.embeddings.weight.element_size()
    info = {
        "checkpoint": str(lm.checkpoint_dir),
        "family": c.family,
        "weights": lm.report.files,
        "tokenizer": lm.tokenizer.kind,
        "parameters": params,
        "bytes": params * elem,
        "dtype": str(lm.dtype),
        "dtype_reason": lm.dtype_reason,
        "semantic_ids": [c.semantic_begin_id, c.semantic_end_id],
        "im_end_id": lm.im_end_id,
        "slow_kv_bytes_per_token": c.slow_kv_bytes_per_token(elem),
        "fast_kv_bytes_per_row": c.fast_kv_bytes_per_frame(elem),
        "unexpected_tensors": lm.report.unexpected,
        "config": c.to_json_dict(),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"checkpoint   {info['checkpoint']} ({c.family}, tokenizer {info['tokenizer']})")
    print(
        f"slow         {c.n_layer} layers, dim {c.dim}, heads {c.n_head}/{c.n_local_heads} x {c.head_dim}, "
        f"ffn {c.intermediate_size}, vocab {c.vocab_size}, qk-norm {c.attention_qk_norm}, "
        f"tied {c.tie_word_embeddings}, max_seq_len {c.max_seq_len}"
    )
    print(
        f"fast         {c.n_fast_layer} layers, dim {c.fast_dim}, heads {c.fast_n_head}/{c.fast_n_local_heads} "
        f"x {c.fast_head_dim}, ffn {c.fast_intermediate_size}, input {'post' if c.norm_fastlayer_input else 'pre'}-norm"
    )
    print(
        f"codebooks    {c.num_codebooks} x {c.codebook_size}, semantic ids {c.semantic_begin_id}..{c.semantic_end_id}"
    )
    print(f"parameters   {params:,} ({params * elem / 2**20:.1f} MiB in {lm.dtype})")
    print(f"dtype        {DtypeChoice(lm.dtype, lm.dtype_reason).describe()} on {lm.device}")
    print(
        f"KV bytes     {info['slow_kv_bytes_per_token']:,} per token (slow) + "
        f"{info['fast_kv_bytes_per_row']:,} per row (fast)"
    )
    if lm.report.unexpected:
        print(f"unexpected   {len(lm.report.unexpected)} tensor(s) not used: {lm.report.unexpected[:5]}")
    return 0


def cmd_score(args) -> int:
    import torch

    from .loader import load_model

    lm = load_model(args.checkpoint, device=args.device, dtype=args.dtype)
    tokens = np.load(args.tokens)
    c = lm.config
    if tokens.ndim != 2 or tokens.shape[0] != 1 + c.num_codebooks or not np.issubdtype(tokens.dtype, np.integer):
        return error(
            f"{args.tokens}: expected an int64 [{1 + c.num_codebooks}, T] token matrix, "
            f"got {tokens.dtype} {list(tokens.shape)}"
        )
    slow, fast = lm.model.score(torch.from_numpy(tokens.astype(np.int64)).to(lm.device))
    np.savez(args.out, slow_logits=slow.float().cpu().numpy(), fast_logits=fast.float().cpu().numpy())
    print(f"wrote {args.out}: slow_logits {list(slow.shape)}, fast_logits {list(fast.shape)}")
    return 0


def cmd_generate(args) -> int:
    from .engine import Engine, EngineConfig
    from .loader import load_model
    from .types import Request, SamplingParams

    lm = load_model(args.checkpoint, device=args.device, dtype=args.dtype)
    prompt = np.load(args.prompt_tokens)
    overrides = {
        k: v
        for k, v in dict(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            repetition_penalty=args.repetition_penalty,
        ).items()
        if v is not None
    }
    # current upstream's loop, for either format: repetition-aware sampling over 10 frames
    sampling = SamplingParams(ras_window=10, **overrides)
    config = EngineConfig(
        max_rows=1,
        max_tokens=prompt.shape[-1] + args.max_frames,
        prefill_chunk=args.prefill_chunk,
        # the whole decode frame in one torch.compile(fullgraph=True) graph: a graph break
        # raises (on CUDA, captured as a CUDA graph per batch-size bucket)
        compile=args.compile,
        cuda_graphs=args.compile and lm.device.type == "cuda",
    )
    engine = Engine(lm, config)
    result = engine.generate([Request("cli", prompt, args.max_frames, sampling, stop_on_eos=not args.no_eos)])[0]
    if result.error:
        return error(result.error)
    np.save(args.out, result.codes)
    print(
        f"wrote {args.out}: codes {list(result.codes.shape)}, stop {result.stop_reason}, "
        f"prefill {result.prefill_ms:.1f} ms, decode {result.frame_ms:.1f} ms/frame"
    )
    return 0


def cmd_parity(args) -> int:
    from .checks import DEFAULT_VECTORS, vector_parity

    report = vector_parity(Path(args.vectors or DEFAULT_VECTORS), args.device, args.dtype)
    for name, r in report.items():
        print(
            f"{name} {r['dtype']} on {r['device']}: logits max |diff| slow {r['slow_logits_max_abs_diff']:.2e} "
            f"fast {r['fast_logits_max_abs_diff']:.2e}; greedy frames equal {r['frames_equal']}/{r['upstream_frames']} "
            f"(leading {r['leading_frames_equal']}), stop {r['stop_reason']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def cmd_frame_check(args) -> int:
    from .checks import frame_check

    report = frame_check(args.device, args.dtype, [v for v in args.variants.split(",") if v])
    audit = report["audit"]
    print(
        f"decode step ({report['device']}, {report['dtype']}): capturable {audit['capturable']} "
        f"(host reads {len(audit['host_reads'])}, unregistered tensors {audit['foreign_reads']} read / "
        f"{audit['foreign_writes']} written), addresses stable {audit['addresses_stable']}"
    )
    for variant in (k for k in report if isinstance(report[k], dict) and "rows_identical" in report[k]):
        r = report[variant]
        print(
            f"{variant}: {r['rows_identical']}/{report['rows']} rows identical to the plain frame, graphs {r['graphs']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def cmd_make_tiny(args) -> int:
    from .tiny import make_tiny

    out = make_tiny(
        args.out,
        fmt=args.format,
        seed=args.seed,
        max_seq_len=args.max_seq_len,
        n_layer=args.n_layer,
        dim=args.dim,
        num_codebooks=args.num_codebooks,
        codebook_size=args.codebook_size,
    )
    print(f"wrote {args.format} checkpoint to {out}")
    return 0


def cmd_bench(args) -> int:
    from .bench import run_bench

    return run_bench(args)


def _add_checkpoint_commands(sub) -> None:
    """info, score and generate: one checkpoint each."""
    p = sub.add_parser("info", help="config summary, parameter count, bytes, KV bytes per token")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--json", action="store_true")
    _dtype_arg(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("score", help="teacher-forced slow + fast logits of a token matrix")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--tokens", required=True, help="int64 [1+num_codebooks, T] .npy")
    p.add_argument("--out", required=True, help="output .npz (slow_logits, fast_logits)")
    _dtype_arg(p)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("generate", help="generate codes for one prompt token matrix")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt-tokens", required=True)
    p.add_argument("--max-frames", type=int, required=True)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--repetition-penalty", type=float, help="S1-era penalty (e.g. 1.1); default off")
    p.add_argument("--no-eos", action="store_true", help="ignore <|im_end|>: always run the full budget")
    p.add_argument("--prefill-chunk", type=int, default=512)
    p.add_argument("--compile", action="store_true", help="compile the whole decode frame (fullgraph)")
    p.add_argument("--out", required=True)
    _dtype_arg(p)
    p.set_defaults(func=cmd_generate)


def _add_check_commands(sub) -> None:
    """parity, frame-check and make-tiny: the project's own checks and test checkpoints."""
    p = sub.add_parser("parity", help="logits and greedy codes vs the upstream vectors, in any dtype/device")
    p.add_argument("--vectors", help="folder of the vector sets (default: the ones shipped in tests/vectors)")
    p.add_argument("--json", help="write the report here")
    _dtype_arg(p, default="float32")  # the vectors' exact guarantees are float32's
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("frame-check", help="graphed and compiled decode steps against the plain one; capture audit")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--variants", default="compiled", help="comma list of graphs, compiled (default compiled)")
    _dtype_arg(p, default="float32")
    p.set_defaults(func=cmd_frame_check)

    p = sub.add_parser("make-tiny", help="write a deterministic random checkpoint in the real format")
    p.add_argument("--format", choices=["s1", "s2"], default="s1")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--n-layer", type=int)
    p.add_argument("--dim", type=int)
    p.add_argument("--num-codebooks", type=int)
    p.add_argument("--codebook-size", type=int)
    p.set_defaults(func=cmd_make_tiny)


def _add_bench_command(sub) -> None:
    p = sub.add_parser("bench", help="engine throughput: batched vs one row at a time vs uncached")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint")
    src.add_argument("--size", choices=["tiny", "small", "s1-mini", "s2-pro"], default="tiny")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--max-rows", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--frames", type=int, default=64)
    p.add_argument(
        "--references",
        type=int,
        default=0,
        help="share this many reference prompts across rows (prefix reuse); 0 = none",
    )
    p.add_argument("--reference-frames", type=int, default=100)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="slot capacity in columns (0 = the longest row); the pipeline's CPU engine uses 512",
    )
    p.add_argument("--uncached", action="store_true", help="also run the (slow) uncached reference loop")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every mode this many times, interleaved; each reports its median run",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--no-single", action="store_true", help="skip the one-row-at-a-time mode")
    p.add_argument(
        "--compile",
        nargs="?",
        const="on",
        default="auto",
        type=compile_mode,
        help="off | on | auto (default, as engine.compile=auto: CUDA, and CPU with packed linears); "
        "a bare --compile is on",
    )
    p.add_argument(
        "--decode-buckets",
        type=lambda text: [int(x) for x in text.split(",")],
        help="batch sizes a compiled frame is built at, e.g. 8,16,32 (default: powers of two; on CPU "
        "--max-rows and its quarters)",
    )
    p.add_argument(
        "--kernels",
        default="eager",
        type=kernel_mode,
        help="engine.kernels of the timed modes: eager (default) | fused | compiled | auto; the kernel count "
        "per step is reported for eager and fused whatever this says",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the table as JSON here")
    _dtype_arg(p)
    p.set_defaults(func=cmd_bench)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_checkpoint_commands(sub)
    _add_check_commands(sub)
    _add_bench_command(sub)
    args = parser.parse_args(argv)
    from .architecture import CheckpointError

    return dispatch(args, (CheckpointError,))


if __name__ == "__main__":
    sys.exit(main())

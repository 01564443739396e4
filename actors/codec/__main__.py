"""Codec command line.

    python -m actors.codec encode --checkpoint codec.pth IN.wav OUT.npy
    python -m actors.codec decode --checkpoint codec.pth IN.npy OUT.flac|OUT.wav
    python -m actors.codec make-tiny --out DIR [--seed N]
    python -m actors.codec make-random --size real --out DIR [--device cuda] [--seed N]
    python -m actors.codec bench --size tiny|real [--seconds 5] [--json OUT]
    python -m actors.codec gpu-bench [--out DIR] [--backends triton,eager] | --quick

encode/decode read and write audio through actors.audio (soundfile + soxr);
it is imported only by those two commands, so the codec library itself keeps
to torch and numpy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from actors.cli import dispatch, error
from actors.files import atomic_open, write_atomically


def _dtype(names: str) -> str:
    """A dtype name, `auto` (bf16 where the CPU has bf16 units: actors/precision.py), or
    for bench a comma list of them."""
    from actors.precision import AUTO, DTYPES

    for name in names.split(","):
        if name != AUTO and name not in DTYPES:
            raise argparse.ArgumentTypeError(f"dtype must be auto or one of {sorted(DTYPES)}, got {name!r}")
    return names


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="codec.pth, or a directory holding it")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", type=_dtype, default="float32", help="a dtype, or auto (the pipeline's default)")


def _encode(args: argparse.Namespace) -> int:
    from actors.audio import load_reference_audio

    from .loader import load_codec

    codec = load_codec(args.checkpoint, device=args.device, dtype=args.dtype)
    wave = load_reference_audio(
        str(args.input), target_sample_rate=codec.sample_rate, max_seconds=float("inf"), min_rms=0.0
    )
    (codes,) = codec.encode_batch([wave])
    with atomic_open(args.output) as f:
        np.save(f, codes.astype(np.int64))
    print(f"{args.input}: {len(wave) / codec.sample_rate:.2f} s -> codes {list(codes.shape)} in {args.output}")
    return 0


def _decode(args: argparse.Namespace) -> int:
    from actors.audio import encode_audio

    from .loader import load_codec

    suffix = Path(args.output).suffix.lower()
    if suffix not in (".wav", ".flac"):
        return error(f"output must end in .wav or .flac, got {args.output}")
    codec = load_codec(args.checkpoint, device=args.device, dtype=args.dtype)
    codes = np.load(args.input)
    if codes.ndim == 3 and codes.shape[0] == 1:
        codes = codes[0]
    (wave,) = codec.decode_batch([codes])
    write_atomically(args.output, encode_audio(wave, codec.sample_rate, suffix[1:]))
    print(f"{args.input}: codes {list(codes.shape)} -> {len(wave) / codec.sample_rate:.2f} s in {args.output}")
    return 0


def _make_tiny(args: argparse.Namespace) -> int:
    from .tiny import make_tiny

    path = make_tiny(
        args.out,
        seed=args.seed,
        semantic_codebook_size=args.semantic_codebook_size,
        codebook_size=args.codebook_size,
    )
    print(path)
    return 0


def _make_random(args: argparse.Namespace) -> int:
    import time

    from .bench import bench_config
    from .tiny import write_random_codec

    began = time.perf_counter()
    path = write_random_codec(args.out, bench_config(args.size), seed=args.seed, device=args.device)
    print(f"{path} ({args.size}, random weights drawn on {args.device}, {time.perf_counter() - began:.1f} s)")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import format_table, run_bench

    result = run_bench(
        size=args.size,
        seconds=args.seconds,
        repeats=args.repeats,
        big_batch=args.batch,
        big_batch_repeats=args.batch_repeats,
        threads=args.threads,
        dtype=args.dtype,
        device=args.device,
    )
    print(format_table(result))
    if args.json:
        write_atomically(args.json, json.dumps(result, indent=2) + "\n")
    return 0


def _gpu_bench(args: argparse.Namespace) -> int:
    from .gpu_bench import GpuBenchOptions, run_gpu_bench

    if args.quick:
        options = GpuBenchOptions.quick(out=args.out)
    else:
        options = GpuBenchOptions(
            device=args.device,
            size=args.size,
            dtype=args.dtype,
            rows=tuple(int(r) for r in args.rows.split(",")),
            seconds=tuple(float(s) for s in args.seconds.split(",")),
            backends=tuple(args.backends.split(",")),
            graphs=tuple(g == "on" for g in args.graphs.split(",")),
            budget_s=args.budget_s,
            overlap=not args.no_overlap,
            out=args.out,
        )
    run_gpu_bench(options)
    if args.out:
        print(args.out / "codec_gpu_bench.json")
    return 0


def _add_make_random(commands) -> None:
    random = commands.add_parser("make-random", help="write a random codec of the real (or tiny) size")
    random.add_argument("--out", required=True, type=Path)
    random.add_argument("--size", choices=["tiny", "real"], default="real")
    random.add_argument("--seed", type=int, default=0)
    random.add_argument(
        "--device", default="cpu", help="where the weights are drawn: cpu | cuda (seconds, not minutes)"
    )
    random.set_defaults(func=_make_random)


def _add_gpu_bench(commands) -> None:
    from .device import BACKENDS

    gpu = commands.add_parser("gpu-bench", help="GPU decode: backends x graphs x rows x seconds, JSON as it goes")
    gpu.add_argument("--quick", action="store_true", help="CPU, tiny codec, Triton's interpreter (what CI runs)")
    gpu.add_argument("--device", default="cuda")
    gpu.add_argument("--size", choices=["tiny", "real"], default="real")
    gpu.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    gpu.add_argument("--rows", default="1,4,16,64", help="comma list")
    gpu.add_argument("--seconds", default="2,10", help="comma list: audio seconds per row")
    gpu.add_argument("--backends", default="triton,eager", help=f"comma list of {', '.join(BACKENDS[1:])}")
    gpu.add_argument("--graphs", default="on,off", help="on, off or both (CUDA graphs per decode shape)")
    gpu.add_argument("--budget-s", type=float, default=150.0, help="figures past this are skipped, not cut")
    gpu.add_argument("--no-overlap", action="store_true", help="skip the codec-beside-engine figure")
    gpu.add_argument("--out", type=Path, default=None, help="folder for codec_gpu_bench.json")
    gpu.set_defaults(func=_gpu_bench)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.codec", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    encode = commands.add_parser("encode", help="audio file -> codes .npy (int64 [codebooks, frames])")
    _add_model_arguments(encode)
    encode.add_argument("input", type=Path)
    encode.add_argument("output", type=Path)
    encode.set_defaults(func=_encode)

    decode = commands.add_parser("decode", help="codes .npy -> .wav (float32) or .flac (16-bit)")
    _add_model_arguments(decode)
    decode.add_argument("input", type=Path)
    decode.add_argument("output", type=Path)
    decode.set_defaults(func=_decode)

    tiny = commands.add_parser("make-tiny", help="write a deterministic random tiny codec")
    tiny.add_argument("--out", required=True, type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--semantic-codebook-size", type=int, default=128)
    tiny.add_argument("--codebook-size", type=int, default=128)
    tiny.set_defaults(func=_make_tiny)

    _add_make_random(commands)

    bench = commands.add_parser("bench", help="decode/encode throughput on random weights")
    bench.add_argument("--size", choices=["tiny", "real"], default="tiny")
    bench.add_argument("--seconds", type=float, default=5.0)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--batch", type=int, default=16, help="the larger decode batch")
    bench.add_argument("--batch-repeats", type=int, default=1)
    bench.add_argument("--threads", type=int, default=None)
    bench.add_argument(
        "--dtype",
        type=_dtype,
        default="float32",
        help="a dtype, auto, or a comma list (float32,bfloat16) timed side by side, interleaved; "
        "bfloat16 is ~2x faster on CPUs with bf16 units, ~1.5%% error",
    )
    bench.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    bench.add_argument("--json", type=Path, default=None)
    bench.set_defaults(func=_bench)
    _add_gpu_bench(commands)

    args = parser.parse_args(argv)
    from .config import CodecConfigError
    from .loader import CodecCheckpointError

    errors = (FileNotFoundError, CodecCheckpointError, CodecConfigError)
    if args.command in ("encode", "decode"):  # the audio files' errors (bench and make-tiny read none)
        from actors.audio import ReferenceAudioError

        errors += (ReferenceAudioError,)
    return dispatch(args, errors)


if __name__ == "__main__":
    sys.exit(main())

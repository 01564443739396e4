"""The batch sizes a static, compiled or captured decode step is built at (engine.decode_buckets),
and which one serves n live rows."""

from __future__ import annotations


def bucket_size(n: int, max_rows: int, buckets=None) -> int:
    """The captured batch size that serves n live rows: the smallest configured bucket that
    holds them (default: the next power of two), capped at max_rows."""
    if buckets:
        return min([b for b in buckets if b >= n] or [max_rows])
    return min(max_rows, 1 << max(0, n - 1).bit_length())


def cpu_buckets(max_rows: int) -> list[int]:
    """The batch sizes a frame compiled on CPU is built at unless engine.decode_buckets says:
    max_rows and its quarters. Each is a compile of about a minute or more on CPU (once per
    node: the cache keeps them), so not every size; the smaller ones serve a batch's tail, where
    a frame at 32 rows is mostly arithmetic and a live row fewer is work saved (`small`, 32
    bf16 rows, against the starting commit's frames/s, interleaved: max_rows alone 1.15x;
    max_rows, half, quarter 1.25x over 4 rounds and 1.28x over 3; with three quarters too
    1.30x in those 3, 1.30-1.31x in each). Never 1 row where there are two slots: inductor
    compiles a 1-row softmax over 4,096 codes into another reduction than a 2..32-row one
    (bfloat16, Sapphire Rapids, 2 threads: row 0's probabilities differ), so a row decoded
    alone in a 1-row graph would not get the codes it gets beside others."""
    smallest = min(2, max_rows)
    return sorted({max(smallest, max_rows * quarters // 4) for quarters in (1, 2, 3, 4)})


def bucket_sizes(max_rows: int, buckets=None) -> list[int]:
    """Every batch size `bucket_size` can return: the sizes a captured frame is compiled at."""
    return sorted({bucket_size(n, max_rows, buckets) for n in range(1, max_rows + 1)})

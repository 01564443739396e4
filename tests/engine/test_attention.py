"""CPU attention (actors/engine/attention.py): the C++ op computing each (row, kv head) whole on one
thread, and the fallback, fixed key chunks merged by log-sum-exp on one thread."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from actors.engine.attention import (
    ATTEND_BLOCK,
    ATTEND_CHUNK,
    attend,
    attend_in_chunks,
    attend_length,
    attend_reached_op,
    attend_visible,
    load_native,
    rows_apart_serves,
)


def _batch(lengths, keys, dtype, queries=1, heads=2, dim=16, seed=0):
    """q/k/v for rows whose last `queries` columns sit at the end of their `lengths`, and the
    causal mask over `keys` cached keys [B, 1, Q, L]."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    q = torch.randn(b, heads, queries, dim, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(b, heads, keys, dim, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(b, heads, keys, dim, generator=g, dtype=torch.float64).to(dtype)
    positions = torch.tensor(lengths)[:, None] - queries + torch.arange(queries)[None, :]
    allowed = (torch.arange(keys)[None, None, :] <= positions[:, :, None]).unsqueeze(1)
    return q, k, v, allowed


@pytest.mark.parametrize("queries", [1, 5])
def test_chunks_merged_equal_one_softmax_over_every_key(queries):
    """float64: the merged chunks are plain masked attention, rows ending inside the first
    chunk, on a boundary and in the last one (whose other chunks carry no key for them)."""
    q, k, v, allowed = _batch([40, ATTEND_CHUNK, 2 * ATTEND_CHUNK + 7], 3 * ATTEND_CHUNK, torch.float64, queries)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert (attend_in_chunks(q, k, v, allowed) - reference).abs().max() < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_is_the_same_bit_for_bit_whatever_its_batch_reads(dtype):
    """A short row alone (one chunk read) and beside a long row (three chunks read): identical
    output, because the chunks it does not reach merge with weight exactly 0."""
    q, k, v, allowed = _batch([70, 3 * ATTEND_CHUNK - 1], 3 * ATTEND_CHUNK, dtype)
    together = attend_in_chunks(q, k, v, allowed)
    alone = attend_in_chunks(q[:1], k[:1, :, :ATTEND_CHUNK], v[:1, :, :ATTEND_CHUNK], allowed[:1, ..., :ATTEND_CHUNK])
    assert torch.equal(together[:1], alone)
    two_chunks = attend_in_chunks(
        q[:1], k[:1, :, : 2 * ATTEND_CHUNK], v[:1, :, : 2 * ATTEND_CHUNK], allowed[:1, ..., : 2 * ATTEND_CHUNK]
    )
    assert torch.equal(two_chunks, alone)


def test_grouped_query_heads_fold_onto_their_kv_head():
    """attend(): 4 query heads on 2 kv heads, masked (chunked path) and unmasked (matmul path),
    against attention over K/V repeated per query head."""
    q, k, v, allowed = _batch([90, 200], 2 * ATTEND_CHUNK, torch.float64, queries=3, heads=2)
    q4 = torch.cat([q, q.flip(-1)], dim=1)[:, [0, 2, 1, 3]]  # heads 0,1 -> kv 0; 2,3 -> kv 1
    repeated_k, repeated_v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    mask = allowed[:, 0]  # [B, T, L], as the model hands it over
    reference = F.scaled_dot_product_attention(q4, repeated_k, repeated_v, attn_mask=allowed)
    assert (attend(q4, k, v, mask) - reference).abs().max() < 1e-12
    unmasked = F.scaled_dot_product_attention(q4, repeated_k, repeated_v)
    assert (attend(q4, k, v, None) - unmasked).abs().max() < 1e-12


def test_a_batch_reads_whole_chunks_on_cpu_and_whole_blocks_elsewhere():
    assert [attend_length(n, 1024, "cpu") for n in (1, ATTEND_CHUNK, ATTEND_CHUNK + 1, 1000)] == [
        ATTEND_CHUNK,
        ATTEND_CHUNK,
        2 * ATTEND_CHUNK,
        1024,
    ]
    assert attend_length(100, 1024, "cuda") == ATTEND_BLOCK
    assert attend_length(100, 90, "cpu") == 90  # never past the slot's capacity


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16])  # f32: ~15 s
def test_a_static_frame_reads_only_the_keys_its_rows_reach_with_the_eager_numbers(dtype):
    """chorus::attend_reached over a whole 512-position cache, 2 chunks reached: the eager
    chunked attention's numbers bit for bit, and the keys past the reach are never read (NaN
    there would show), which is what lets a compiled CPU frame keep one graph for any length."""
    lengths, slots = [70, 2 * ATTEND_CHUNK - 3], 4 * ATTEND_CHUNK
    q, k, v, allowed = _batch(lengths, slots, dtype, heads=4)
    q = torch.cat([q, q.flip(-1)], dim=1)  # 8 query heads on 4 kv heads
    reach = attend_length(max(lengths), slots, "cpu")
    k[:, :, reach:], v[:, :, reach:] = float("nan"), float("nan")
    positions = torch.tensor(lengths)[:, None] - 1
    out = attend_reached_op(q, k, v, positions, torch.tensor(reach))
    eager = attend(q, k[:, :, :reach], v[:, :, :reach], allowed[:, 0, :, :reach])
    assert out.is_contiguous() and not out.isnan().any()
    assert torch.equal(out, eager)
    torch.library.opcheck(
        attend_reached_op, (q, k, v, positions, torch.tensor(reach)), test_utils=["test_schema", "test_faketensor"]
    )


@pytest.mark.slow  # ~12 s a dtype: 32 rows against each alone
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fast_stacks_attention_gives_a_row_alone_what_it_gives_it_among_32(dtype):
    # bfloat16 batched products gave some rows other results at 4 keys (Sapphire Rapids)
    torch.manual_seed(0)
    for keys in range(1, 11):
        for _ in range(5):
            q = (torch.randn(32, 16, 1, 64) * 3).to(dtype)
            k, v = (torch.randn(32, 8, keys, 64) * 3).to(dtype), torch.randn(32, 8, keys, 64).to(dtype)
            together = attend_visible(q, k, v)
            assert together.dtype == dtype
            for row in range(32):
                alone = attend_visible(q[row : row + 1], k[row : row + 1], v[row : row + 1])
                assert torch.equal(alone, together[row : row + 1]), (keys, row)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_of_a_mixed_batch_equals_the_row_alone_on_any_thread_count(threads, dtype):
    """Rows of other lengths beside it (other chunks reached), one query column as in decode:
    each row's result is the row's alone, bit for bit, also when torch runs several threads
    (whose division of the fused kernel's work once changed a row's last bits)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v, allowed = _batch([70, 200, 129, 300, 5, 256], 3 * ATTEND_CHUNK, dtype, heads=4)
        together = attend_in_chunks(q, k, v, allowed)
        for row in range(q.shape[0]):
            one = slice(row, row + 1)
            assert torch.equal(together[one], attend_in_chunks(q[one], k[one], v[one], allowed[one])), row
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def _at_threads(threads: int, run, *args):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return run(*args)
    finally:
        torch.set_num_threads(before)


def _native_or_skip():
    if not load_native():
        pytest.skip("no C++ compiler here: attend() keeps the fused kernel on one thread")
    return torch.ops.chorus_attend.attend_rows


def _grouped(lengths, keys, dtype, queries, heads, kv_heads, dim, seed=0):
    """q [B, heads, Q, D] over k/v [B, kv_heads, keys, D], the rows' last Q columns ending at
    their lengths, and the causal mask [B, Q, keys] as the model hands it to attend()."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    q = (torch.randn(b, heads, queries, dim, generator=g) * 2).to(dtype)
    k = (torch.randn(b, kv_heads, keys, dim, generator=g) * 2).to(dtype)
    v = torch.randn(b, kv_heads, keys, dim, generator=g).to(dtype)
    positions = torch.tensor(lengths)[:, None] - queries + torch.arange(queries)[None, :]
    mask = torch.arange(keys)[None, None, :] <= positions[:, :, None]
    return q, k, v, mask


def _float64_attention(q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    wide = [t.double().repeat_interleave(group, dim=1) for t in (k, v)]
    return F.scaled_dot_product_attention(q.double(), *wide, attn_mask=mask.unsqueeze(1))


# (query heads, kv heads, head size, query columns): the `small` slow stack's decode (16/8 x 128),
# S2-Pro's (32/8), the tiny model's (4/2 x 32), an odd group (3 per kv head, the last head of a
# pair alone) and a prefill-like run of query columns
SHAPES = [(16, 8, 128, 1), (32, 8, 128, 1), (4, 2, 32, 1), (6, 2, 64, 3), (3, 1, 16, 7)]
LENGTHS = [70, 200, 129, 300, 5, 256, 1, 128]  # mixed: rows ending in every 128-key chunk


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_attend_rows_gives_each_row_of_a_mixed_batch_what_it_gives_the_row_alone(shape, dtype, threads):
    """chorus_attend::attend_rows, the CPU's masked attention: every row of a batch of mixed
    lengths (the batch reading 384 keys) equals the row alone reading only its own keys, bit for
    bit, at 1 and 2 torch threads; the keys past a row's own are never read (NaN there would
    show); and the numbers are plain attention's within float rounding."""
    op = _native_or_skip()
    heads, kv_heads, dim, queries = shape
    q, k, v, mask = _grouped(LENGTHS, 384, dtype, queries, heads, kv_heads, dim)
    together = _at_threads(threads, op, q, k, v, mask)
    assert together.dtype == dtype and together.shape == q.shape and together.is_contiguous()
    for row, length in enumerate(LENGTHS):
        one = slice(row, row + 1)
        own_k, own_v = k[one, :, :length].clone(), v[one, :, :length].clone()
        past_k = torch.cat([own_k, torch.full_like(k[one, :, :9], float("nan"))], dim=2)
        past_v = torch.cat([own_v, torch.full_like(v[one, :, :9], float("nan"))], dim=2)
        past_mask = torch.cat([mask[one, :, :length], torch.zeros_like(mask[one, :, :9])], dim=2)
        alone = _at_threads(threads, op, q[one], past_k, past_v, past_mask)
        assert torch.equal(alone, together[one]), row
    # float32: the fused kernel is off by up to ~2e-6 here too (scores up to ~40); bf16: one step at |y| < 4
    bound = 1e-5 if dtype == torch.float32 else 1.6e-2
    assert (together.double() - _float64_attention(q, k, v, mask)).abs().max() < bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attend_rows_gives_the_same_numbers_at_any_thread_count(dtype):
    """Each (row, kv head) is computed whole by one thread, so how many threads share the
    pairs changes nothing: 1, 2 and 3 threads give the same bits (torch's fused kernel at 2
    threads did not, test above on the chunked path)."""
    op = _native_or_skip()
    q, k, v, mask = _grouped(LENGTHS, 384, dtype, 1, 16, 8, 128)
    one = _at_threads(1, op, q, k, v, mask)
    for threads in (2, 3):
        assert torch.equal(_at_threads(threads, op, q, k, v, mask), one), threads


def test_attend_rows_masks_inside_a_row_and_gives_zero_where_nothing_is_allowed():
    """A mask with holes (not only a causal edge) is honoured key by key, and a query with no
    allowed key gets 0, as the fused kernel gives it."""
    op = _native_or_skip()
    q, k, v, mask = _grouped([90, 40], 100, torch.float32, 2, 4, 2, 32)
    mask = mask.clone()
    mask[0, :, 10:30] = False  # a hole in row 0
    mask[1, 1] = False  # row 1's second query sees nothing
    out = op(q, k, v, mask)
    reference = _float64_attention(q, k, v, mask)
    assert (out[0].double() - reference[0]).abs().max() < 1e-5
    assert (out[1, :, 0].double() - reference[1, :, 0]).abs().max() < 1e-5
    assert torch.equal(out[1, :, 1], torch.zeros_like(out[1, :, 1]))


def test_attend_serves_masked_cpu_attention_through_the_rows_apart_op():
    """attend() hands masked float32/bfloat16 CPU attention to the C++ op where it is built;
    float64 stays on the chunked fused kernel (the op is built for float32 and bfloat16)."""
    op = _native_or_skip()
    q, k, v, mask = _grouped([60, 150], 2 * ATTEND_CHUNK, torch.float32, 1, 4, 2, 32)
    assert rows_apart_serves(q) and torch.equal(attend(q, k, v, mask), op(q, k, v, mask))
    assert not rows_apart_serves(q.double())
    with pytest.raises(RuntimeError, match="head size"):
        op(q[..., :24], k[..., :24], v[..., :24], mask)

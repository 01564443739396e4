"""The engine's streaming API (add / step / has_unfinished / abort) and the sync-free decode
frame: requests joining mid-stream, aborts, long streams with flat memory, and the whole frame
compiled with torch.compile(fullgraph=True) against the eager frame."""

import numpy as np
import pytest

from actors.engine import STOP_BUDGET, STOP_EOS, STOP_ERROR, Engine, EngineConfig, Request, SamplingParams

HOT = SamplingParams(temperature=0.9, top_p=0.9, top_k=20, ras_window=10)
# every sampling feature on at once: temperature, top-p, top-k, RAS and the S1 penalty
ALL_ON = SamplingParams(temperature=0.9, top_p=0.85, top_k=20, ras_window=10, repetition_penalty=1.2)


def text_prompt(length: int, seed: int, codebooks: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    prompt = np.zeros((1 + codebooks, length), np.int64)
    prompt[0] = rng.integers(32, 127, length)  # printable byte tokens
    return prompt


def requests(n: int, sampling=HOT, frames=lambda i: 6 + i % 5, prefix: str = "r") -> list[Request]:
    return [
        Request(f"{prefix}{i}", text_prompt(8 + (i * 7) % 23, seed=i), frames(i), sampling.with_seed(i), False)
        for i in range(n)
    ]


def run(engine: Engine) -> dict:
    """Step until nothing is left; results by id, with the step each finished at."""
    out, step = {}, 0
    while engine.has_unfinished():
        step += 1
        for result in engine.step():
            out[result.request_id] = (result, step)
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_request_added_mid_stream_gets_its_solo_codes(lm64, lm32, dtype):
    lm = lm64 if dtype == "float64" else lm32
    target = Request("target", text_prompt(17, seed=99), 12, HOT.with_seed(4242), stop_on_eos=False)
    alone = Engine(lm, EngineConfig(max_rows=1, max_tokens=128)).generate([target])[0]
    engine = Engine(lm, EngineConfig(max_rows=4, max_tokens=128))
    early = requests(3, frames=lambda i: 20 + 3 * i)
    for r in early:
        engine.add(r)
    for _ in range(5):  # the first rows are 5 frames in when the target arrives
        assert engine.step() == []
    engine.add(target)
    done = run(engine)
    result, finished_at = done["target"]
    assert result.frames == 12 and result.stop_reason == STOP_BUDGET
    # float64: bit-identical; float32: the same codes (the contract of batch independence)
    assert np.array_equal(result.codes, alone.codes)
    # it really ran beside the others: they finished after it joined, and it before them
    assert all(done[r.request_id][1] > 6 for r in early) and finished_at < done["r2"][1]
    for r in early:
        solo = Engine(lm, EngineConfig(max_rows=1, max_tokens=128)).generate([r])[0]
        assert np.array_equal(done[r.request_id][0].codes, solo.codes)


def test_abort_frees_the_slot_and_leaves_the_others_alone(lm32):
    engine = Engine(lm32, EngineConfig(max_rows=3, max_tokens=128))
    rows = requests(5, frames=lambda i: 15)
    for r in rows:
        engine.add(r)
    engine.step()
    engine.step()
    assert engine.cache.free_slots() == 0
    assert engine.abort("r1")  # running: its slot frees at once
    assert engine.cache.free_slots() == 1
    assert engine.abort("r4")  # still queued
    assert not engine.abort("r4") and not engine.abort("nobody")
    done = run(engine)
    assert sorted(done) == ["r0", "r2", "r3"]  # an aborted request returns no Result
    for r in (rows[0], rows[2], rows[3]):
        solo = Engine(lm32, EngineConfig(max_rows=1, max_tokens=128)).generate([r])[0]
        assert np.array_equal(done[r.request_id][0].codes, solo.codes)
    assert engine.cache.free_slots() == 3 and not engine.has_unfinished()


def test_bad_and_empty_requests_come_back_from_the_next_step(lm32):
    engine = Engine(lm32, EngineConfig(max_rows=2, max_tokens=64))
    engine.add(Request("bad", text_prompt(8, 0)[:3], 4))  # wrong number of rows
    engine.add(Request("hot", text_prompt(8, 0), 4, SamplingParams(temperature=1e39)))
    engine.add(Request("zero", text_prompt(8, 0), 0))
    engine.add(Request("long", text_prompt(60, 0), 10))  # 70 positions > max_tokens 64
    assert engine.has_unfinished()
    got = {r.request_id: r for r in engine.step()}
    assert {k: v.stop_reason for k, v in got.items()} == {
        "bad": STOP_ERROR,
        "hot": STOP_ERROR,
        "zero": STOP_BUDGET,
        "long": STOP_ERROR,
    }
    assert "float32" in got["hot"].error and "max_tokens 64" in got["long"].error
    assert not engine.has_unfinished()


@pytest.mark.slow  # a thousand requests: ~7 s
def test_a_thousand_requests_keep_kv_memory_flat(lm32):
    """1,000 requests streamed through add/step with 8 slots: the K/V buffers are the same
    allocation throughout, every slot comes back, and the engine keeps no per-request state."""
    engine = Engine(lm32, EngineConfig(max_rows=8, max_tokens=64))
    pointers = [layer.k.data_ptr() for layer in engine.cache.slow + engine.cache.fast]
    kv = engine.kv_bytes()["total"]
    rows = requests(1000, sampling=ALL_ON, frames=lambda i: 1 + i % 3)
    finished = 0
    for start in range(0, len(rows), 50):  # keep adding while earlier rows run
        for r in rows[start : start + 50]:
            engine.add(r)
        for _ in range(10):
            finished += len(engine.step())
    finished += sum(1 for _ in run(engine))
    assert finished == 1000
    assert [layer.k.data_ptr() for layer in engine.cache.slow + engine.cache.fast] == pointers
    assert engine.cache.allocated_bytes() == kv
    assert engine.cache.free_slots() == 8
    s = engine.scheduler
    assert not s.waiting and not s.live and not s.done
    assert all(p is None for p in engine.runner.sampling.params)


@pytest.mark.slow
def test_compiled_frame_equals_eager_frame(lm32):
    """The whole decode frame (slow step, fast stack, sampling) under
    torch.compile(fullgraph=True): any graph break raises. 8 rows with every sampling
    feature on, some crossing the 128-key chunk boundary mid-run, in slots of 384 positions
    (CPU: the static frame attends to the keys its rows reach, at run time); its tokens equal
    the eager (dynamic-shape) frame's, frame after frame."""
    rows = [
        Request(f"c{i}", text_prompt(14 + 16 * i, seed=i), 4, ALL_ON.with_seed(i), stop_on_eos=False) for i in range(8)
    ]
    eager = Engine(lm32, EngineConfig(max_rows=8, max_tokens=384)).generate(rows)
    compiled = Engine(lm32, EngineConfig(max_rows=8, max_tokens=384, compile=True)).generate(rows)
    assert all(r.frames == 4 for r in compiled)
    for a, b in zip(eager, compiled):
        assert np.array_equal(a.codes, b.codes), a.request_id


def test_decode_buckets_pad_to_the_smallest_that_fits():
    from actors.engine.buckets import bucket_size

    assert [bucket_size(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert [bucket_size(n, 64, [16, 64]) for n in (1, 16, 17, 64)] == [16, 16, 64, 64]
    with pytest.raises(ValueError, match="decode_buckets"):
        EngineConfig(max_rows=8, decode_buckets=[16]).validate()


@pytest.mark.parametrize("kernels", ["eager", pytest.param("fused", marks=pytest.mark.slow)])
def test_overlapped_steps_give_every_row_what_the_plain_steps_give(lm32, kernels):
    """engine.overlap_host: each step launches its frame, then reads the previous one's tokens.
    Rows that stop on EOS or their budget, a row aborted mid-stream and rows added mid-stream
    get the same codes and stop reasons as with the plain steps, and the slots all come back."""
    sampling = SamplingParams(temperature=1.0, top_p=0.95, top_k=0, ras_window=4)
    rng = np.random.default_rng(3)
    requests = []
    for i in range(7):
        prompt = np.zeros((1 + lm32.config.num_codebooks, 5 + i), np.int64)
        prompt[0] = rng.integers(32, 127, prompt.shape[1])
        requests.append(Request(f"r{i}", prompt, 4 + 3 * i, sampling.with_seed(i), stop_on_eos=True))

    def run(overlap: bool) -> dict:
        engine = Engine(lm32, EngineConfig(max_rows=3, max_tokens=64, overlap_host=overlap, kernels=kernels))
        assert engine.scheduler.overlap is overlap
        for r in requests[:4]:
            engine.add(r)
        results, steps = {}, 0
        while engine.has_unfinished():
            results |= {result.request_id: result for result in engine.step()}
            steps += 1
            if steps == 2:
                engine.abort("r1")
                for r in requests[4:]:
                    engine.add(r)
        assert engine.cache.free_slots() == 3
        return results

    plain, overlapped = run(False), run(True)
    assert set(plain) == set(overlapped) == {f"r{i}" for i in range(7)} - {"r1"}
    for rid, result in plain.items():
        assert overlapped[rid].stop_reason == result.stop_reason
        assert np.array_equal(overlapped[rid].codes, result.codes)
    assert {r.stop_reason for r in plain.values()} == {STOP_BUDGET, STOP_EOS}  # both kinds of stop met

"""The uncached reference generator: one row, and every step recomputes the whole sequence
(slow stack over all columns so far, fast stack over the frame so far) without any KV cache.
Slow by design; kept as the oracle for the cached engine and as the benchmark's baseline.
It picks tokens with the same rules, random streams and stop rule as the engine
(`decoding`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Optional

import numpy as np
import torch

from .decoding import Candidates, SlotSampling, accept_frame, first_code, pick_code, pick_main
from .loader import LoadedModel
from .types import STOP_BUDGET, Request, Result

# observer(frame_index, slow_logits [n_candidates], fast_logits [C-1, codebook_size])
LogitObserver = Callable[[int, torch.Tensor, torch.Tensor], None]


@torch.inference_mode()
def reference_generate(
    loaded: LoadedModel, request: Request, codebook_limits=None, observe: Optional[LogitObserver] = None
) -> Result:
    model, c = loaded.model, loaded.config
    cand = Candidates(c, loaded.im_end_id, loaded.device)
    history = max(1, request.sampling.ras_window, request.sampling.repetition_window)
    sampling = SlotSampling(1, c.num_codebooks, history, len(cand.ids), c.codebook_size, loaded.device)
    sampling.admit(0, request.sampling, request.stop_on_eos)
    rows = slice(0, 1)
    seq = torch.from_numpy(np.ascontiguousarray(request.prompt, dtype=np.int64)).to(loaded.device)
    frames = []
    stop = None
    t0 = time.perf_counter()
    first_frame = 0.0
    while stop is None and request.max_frames > 0:
        state = sampling.batch(rows, [0])
        positions = torch.arange(seq.shape[1], device=loaded.device).unsqueeze(0)
        out = model.forward_slow(seq.unsqueeze(0), positions, last_only=True, logit_rows=cand.ids)
        slow_logits = out.logits[:, -1]
        main_index = pick_main(slow_logits, state, cand)
        main = cand.ids[main_index]
        code = first_code(main, c)
        codes = [code]
        x = out.hidden[:, -1:]  # [1, 1, fast_dim]
        fast_logits = []
        for k in range(1, c.num_codebooks):
            x = torch.cat([x, model.fast_codebook_input(code)], dim=1)
            logits = model.forward_fast(x)[:, -1]
            fast_logits.append(logits[0])
            code = pick_code(logits, k, state, None if codebook_limits is None else codebook_limits[k])
            codes.append(code)
        frame = torch.cat(codes)
        if observe is not None:
            observe(len(frames), slow_logits[0], torch.stack(fast_logits) if fast_logits else slow_logits[:0])
        sampling.commit(rows, main_index, frame.unsqueeze(0), state)
        keep, stop = accept_frame(int(main), cand.im_end_id, request.stop_on_eos, len(frames), request.max_frames)
        if keep:
            frames.append(frame)
            if len(frames) == 1:
                first_frame = time.perf_counter() - t0
            seq = torch.cat([seq, torch.cat([main, frame]).unsqueeze(1)], dim=1)
    codes = torch.stack(frames, dim=1).cpu().numpy() if frames else np.zeros((c.num_codebooks, 0), np.int64)
    total = (time.perf_counter() - t0) * 1e3
    return Result(
        request_id=request.request_id,
        codes=codes,
        stop_reason=stop or STOP_BUDGET,
        prompt_tokens=int(request.prompt.shape[1]),
        frames=codes.shape[1],
        decode_ms=total,
        first_frame_ms=first_frame * 1e3,
        total_ms=total,
    )

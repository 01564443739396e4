"""What each actor is built with: the run config's actor groups as their typed dataclasses
(actors/synth/settings.py) and the run context, in one ActorSettings that is
small, picklable and the same on every actor; and how many blocks an actor holds at once."""

from __future__ import annotations

import math
from dataclasses import fields, replace

from actors.demo import cache_dir_from_environment
from actors.synth.settings import ActorSettings, RunContext, RunGroups

from ..config import ChorusConfig
from ..location import absolute


def blocks_per_actor(rows: int, rows_per_block: int, actors: int) -> int:
    """Each actor's share of an input's blocks (rounded up)."""
    return math.ceil(math.ceil(rows / rows_per_block) / max(1, actors))


def concurrent_blocks(engine, rows_per_block: int, rows: int | None = None, actors: int = 1) -> int:
    """Blocks one actor holds at once: engine.max_concurrent_blocks, or (null) enough that the
    rows in flight cover the slots and the feed queue, plus two: one whose last rows are
    finishing and one being prepared. With fewer, a slot freed near a block's end waits for
    Ray to hand over the next block and for its references (measured on the demo, 16 slots,
    16-row blocks: 2 blocks 71% slot occupancy, 4 blocks 89%). Given the input's `rows`, never
    more than each actor's share of its blocks: Ray Data hands blocks to whichever actor has
    room, so an actor that starts first would otherwise take a small job's every block while
    the others sit idle."""
    if engine.max_concurrent_blocks is not None:
        return int(engine.max_concurrent_blocks)
    cover = -(-(engine.max_rows + engine.feed_queue_rows) // rows_per_block) + 2
    if rows is None:
        return cover
    return max(1, min(cover, blocks_per_actor(rows, rows_per_block, actors)))


# the run config's groups SynthActor receives, as their dataclasses (actors/synth/settings.py)
ACTOR_GROUPS = tuple(f.name for f in fields(RunGroups))


def actor_arguments(
    config: ChorusConfig, input_dir: str | None, run_id: str, attempts: str | None = None, rows: int | None = None
) -> dict:
    """SynthActor's constructor arguments: one ActorSettings (actors/synth/settings.py) holding
    the actor's groups of `config` (typed dataclasses, resolved) and the run context; small,
    picklable and the same on every actor. `rows`: the input's row count, when known (see
    concurrent_blocks)."""
    groups = {group: getattr(config, group) for group in ACTOR_GROUPS}
    groups["data"] = replace(groups["data"], audio_root=absolute(groups["data"].audio_root))
    if groups["model"].cache_dir is None:  # the driver's $CHORUS_CACHE, on every actor's node
        groups["model"] = replace(groups["model"], cache_dir=cache_dir_from_environment())
    cluster = groups["cluster"]
    engine = groups["engine"]
    blocks = concurrent_blocks(engine, cluster.rows_per_block, rows, cluster.num_actors)
    groups["engine"] = replace(engine, max_concurrent_blocks=blocks)
    run_context = RunContext(
        run_id=run_id,
        input_dir=input_dir,
        threads=cluster.threads_per_actor or max(1, math.floor(cluster.cpus_per_actor)),
        attempts_dir=attempts,
    )
    return {"settings": ActorSettings(**groups, run=run_context)}

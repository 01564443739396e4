"""How data/demo/ was made (run once; the results are committed, espeak-ng is not needed to
use them):  apt-get install espeak-ng && python data/demo/make_demo.py
(`--table-only`: the table again from the clips already here, without espeak-ng)

refs/*.flac   short clips of real (synthetic-voice) speech from espeak-ng, one per speaker
demo.parquet  sentences to synthesize: some rows without a reference, some naming a clip by
              path (relative to this directory), one speaker's clip embedded as bytes
dialogue.parquet  a few dialogue rows, whose `voices` are the path speakers' clips (an S2
              checkpoint speaks them: `model=demo_s2 data=demo_dialogue`; S1 refuses them)
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf

HERE = Path(__file__).resolve().parent

# speaker -> (espeak-ng voice, words per minute, what the clip says)
SPEAKERS = {
    "ada": ("en-us+f3", 165, "The quick brown fox jumps over the lazy dog."),
    "ben": ("en-gb", 150, "Please call Stella and ask her to bring these things."),
    "cal": ("en-gb-scotland+m3", 160, "A rainbow is a division of white light."),
    "dee": ("en-us+f5", 170, "Six thick thistle sticks, said the sailor."),
}
EMBEDDED = "dee"  # this speaker's rows carry the clip's bytes instead of a path

SENTENCES = [
    "Hello there, and welcome to the demo.",
    "Batch synthesis turns tables into speech.",
    "Every row gets its own seed.",
    "The weather today is calm and bright.",
    "Numbers like 42 and 7 are read aloud.",
    "A short line.",
    "Trains leave the station every ten minutes.",
    "She sells sea shells by the sea shore.",
    "Rain is expected later in the evening.",
    "This sentence has no reference voice.",
    "Reading, writing and arithmetic.",
    "Coffee first, then questions.",
    "The museum opens at nine in the morning.",
    "Quiet libraries are good places to think.",
    "Our team meets on Tuesdays and Fridays.",
    "Please keep your ticket until the end.",
    "Mountains look closer on clear days.",
    "The recipe needs two eggs and some flour.",
    "Birds gather on the wire at dusk.",
    "Turn left at the second traffic light.",
    "Music drifted in from the open window.",
    "He packed a bag and caught the last bus.",
    "Fresh bread smells wonderful.",
    "The meeting ran a little long.",
    "Lanterns lit the narrow street.",
    "Keep calm and carry on.",
    "Waves rolled gently onto the sand.",
    "The garden is full of tomatoes this year.",
    "Can you hear the difference?",
    "That is the end of the demo.",
]


def make_clip(voice: str, speed: int, text: str) -> tuple[bytes, float]:
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "clip.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(wav), text], check=True)
        audio, rate = sf.read(wav, dtype="float32")
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue(), len(audio) / rate


# dialogues between the path speakers: (voices, text), voices[i] the voice of <|speaker:i|>
DIALOGUES = [
    (
        ["ada", "ben"],
        "<|speaker:0|>Did you catch the early train?<|speaker:1|>I did, and it was on time.<|speaker:0|>"
        "That makes a nice change.",
    ),
    (
        ["cal", "ada", "ben"],
        "<|speaker:0|>Welcome back to the show.<|speaker:1|>Thanks for having us.<|speaker:2|>"
        "It is good to be here.<|speaker:0|>Then let us begin.",
    ),
    (["ben", "cal"], "<|speaker:1|>Is the museum open today?<|speaker:0|>From nine until five."),
]


def make_clips() -> dict[str, bytes]:
    refs = HERE / "refs"
    refs.mkdir(exist_ok=True)
    clips = {}
    for speaker, (voice, speed, text) in SPEAKERS.items():
        flac, seconds = make_clip(voice, speed, text)
        clips[speaker] = flac
        if speaker != EMBEDDED:
            (refs / f"{speaker}.flac").write_bytes(flac)
        print(f"{speaker}: {seconds:.2f} s")
    return clips


def clips_here() -> dict[str, bytes]:
    """The clips as committed: the path speakers' files, the embedded one from the table."""
    table = pq.read_table(HERE / "demo.parquet", columns=["speaker", "ref_audio"]).to_pylist()
    embedded = next(row["ref_audio"] for row in table if row["speaker"] == EMBEDDED)
    clips = {s: (HERE / "refs" / f"{s}.flac").read_bytes() for s in SPEAKERS if s != EMBEDDED}
    return {**clips, EMBEDDED: embedded}


def dialogue_rows() -> list[dict]:
    rows = []
    for index, (speakers, text) in enumerate(DIALOGUES):
        voices = [{"audio_path": f"refs/{s}.flac", "text": SPEAKERS[s][2]} for s in speakers]
        rows.append({"id": f"demo-dialogue-{index}", "text": text, "speaker": "+".join(speakers), "voices": voices})
    return rows


def main() -> None:
    clips = clips_here() if "--table-only" in sys.argv[1:] else make_clips()
    speakers = [None, *SPEAKERS]  # every fifth row without a reference, the rest cycle
    rows = []
    for index, sentence in enumerate(SENTENCES):
        speaker = speakers[index % len(speakers)]
        row = {
            "id": f"demo-{index:03d}",
            "text": sentence,
            "speaker": speaker,
            "ref_text": None,
            "ref_audio_path": None,
            "ref_audio": None,
            "seed": None,
        }
        if speaker is not None:
            row["ref_text"] = SPEAKERS[speaker][2]
            if speaker == EMBEDDED:
                row["ref_audio"] = clips[speaker]
            else:
                row["ref_audio_path"] = f"refs/{speaker}.flac"
        if index % 10 == 3:
            row["seed"] = 1000 + index  # a few rows pin their seed explicitly
        rows.append(row)
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("text", pa.string()),
            ("speaker", pa.string()),
            ("ref_text", pa.string()),
            ("ref_audio_path", pa.string()),
            ("ref_audio", pa.binary()),
            ("seed", pa.int64()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), HERE / "demo.parquet")
    voice = pa.struct([("audio_path", pa.string()), ("text", pa.string())])
    dialogue = pa.schema(
        [("id", pa.string()), ("text", pa.string()), ("speaker", pa.string()), ("voices", pa.list_(voice))]
    )
    pq.write_table(pa.Table.from_pylist(dialogue_rows(), schema=dialogue), HERE / "dialogue.parquet")
    print(f"{len(rows)} rows -> {HERE / 'demo.parquet'}, {len(DIALOGUES)} -> {HERE / 'dialogue.parquet'}")


if __name__ == "__main__":
    main()

"""Text tokenizers of the dual-AR family behind one interface: tiktoken
(`tokenizer.tiktoken` + `special_tokens.json`, OpenAudio S1) and HF `tokenizer.json`
(S2-Pro). Special tokens written inside text are matched as single tokens and are always
looked up by their string, never by a hard-coded id."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from .architecture import CheckpointError

# The special token strings of the family: the one place they are spelled out.
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VOICE = "<|voice|>"
INTERLEAVE = "<|interleave|>"
SEMANTIC_TEMPLATE = "<|semantic:{}|>"
SEMANTIC_PATTERN = re.compile(r"<\|semantic:(\d+)\|>")
SPEAKER_TEMPLATE = "<|speaker:{}|>"  # plain text, not a special token

# Pre-tokenizer split of the S1-era tiktoken tokenizer (upstream FISH_TIKTOKEN_PATTERN): a
# GPT-4o-style pattern that splits punctuation off on its own. It decides where BPE merges
# may happen, so it is part of the format.
_S1_SPLIT_PATTERN = "|".join(
    [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"\p{P}",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(\?!\S)",
        r"\s+",
    ]
)


class Tokenizer:
    """encode(text) -> ids; token_id(str) -> id; the semantic id range (inclusive)."""

    kind: str

    def __init__(self, special: dict[str, int], source: str):
        self.special = special
        self.source = source
        semantic = {int(m.group(1)): tid for tok, tid in special.items() if (m := SEMANTIC_PATTERN.fullmatch(tok))}
        if not semantic:
            raise CheckpointError(
                f"{source}: the tokenizer has no <|semantic:N|> tokens; it is not a dual-AR TTS tokenizer"
            )
        if 0 not in semantic:
            raise CheckpointError(f"{source}: the tokenizer lacks <|semantic:0|>")
        ids = sorted(semantic.values())
        self.semantic_begin_id = semantic[0]
        self.semantic_end_id = ids[-1]
        # Codes map to ids by offset from <|semantic:0|>; require that layout so the model's
        # `token - semantic_begin_id` rule is right.
        for code, tid in semantic.items():
            if tid != self.semantic_begin_id + code:
                raise CheckpointError(
                    f"{source}: <|semantic:{code}|> has id {tid}, expected "
                    f"{self.semantic_begin_id + code} (semantic ids must be contiguous)"
                )

    def token_id(self, token: str) -> int:
        try:
            return self.special[token]
        except KeyError:
            raise CheckpointError(f"{self.source}: special token {token!r} is not in the tokenizer") from None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError


class TiktokenTokenizer(Tokenizer):
    kind = "tiktoken"

    def __init__(self, ranks_path: Path, special_path: Path):
        import tiktoken

        ranks: dict[bytes, int] = {}
        try:
            lines = ranks_path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{ranks_path}: cannot read ({e})") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise CheckpointError(f"{ranks_path}:{n}: expected 'base64token rank', got {line[:60]!r}")
            if parts[0] == "=":  # upstream skips this one malformed entry of real files
                continue
            try:
                ranks[base64.b64decode(parts[0])] = int(parts[1])
            except ValueError as e:
                raise CheckpointError(f"{ranks_path}:{n}: {e}") from None
        try:
            special = json.loads(special_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{special_path}: cannot read ({e})") from None
        if not isinstance(special, dict) or not all(isinstance(v, int) for v in special.values()):
            raise CheckpointError(f"{special_path}: expected a JSON object {{token: id}}")
        super().__init__(special, str(special_path))
        self._encoding = tiktoken.Encoding(
            name=ranks_path.stem, pat_str=_S1_SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=special
        )
        self.vocab_size = max(max(ranks.values(), default=-1), max(special.values())) + 1

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, allowed_special="all", disallowed_special=())


class HFTokenizer(Tokenizer):
    kind = "hf"

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTok

        try:
            self._tok = HFTok.from_file(str(path))
        except Exception as e:  # the library raises a bare Exception on bad files
            raise CheckpointError(f"{path}: cannot load HF tokenizer ({e})") from None
        vocab = self._tok.get_vocab(with_added_tokens=True)
        special = {t: i for t, i in vocab.items() if t.startswith("<|") and t.endswith("|>")}
        super().__init__(special, str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids


def load_tokenizer(checkpoint_dir: str | Path, prefer: str = "auto") -> Tokenizer:
    """tiktoken when `tokenizer.tiktoken` + `special_tokens.json` are present (a real S1
    checkpoint ships only those), else HF `tokenizer.json`. prefer: auto | tiktoken | hf."""
    d = Path(checkpoint_dir)
    ranks, special, hf = d / "tokenizer.tiktoken", d / "special_tokens.json", d / "tokenizer.json"
    has_tiktoken = ranks.is_file() and special.is_file()
    if prefer not in ("auto", "tiktoken", "hf"):
        raise ValueError(f"prefer must be auto, tiktoken or hf, got {prefer!r}")
    if prefer in ("auto", "tiktoken") and has_tiktoken:
        return TiktokenTokenizer(ranks, special)
    if prefer in ("auto", "hf") and hf.is_file():
        return HFTokenizer(hf)
    raise CheckpointError(
        f"{d}: no tokenizer found (expected tokenizer.tiktoken + special_tokens.json, or tokenizer.json)"
    )

"""Token ids to the text each token shows, exactly, for the viewer.

Decoding a trajectory token by token with ``tokenizer.decode([id])`` is wrong for byte-level tokenizers (a
character split over two tokens decodes to two replacement characters), and decoding growing prefixes is quadratic.
Instead each id maps once to the *bytes* it stands for (cached per id), and a trajectory's bytes go through one
incremental UTF-8 decoder: token ``i`` shows the characters completed by its bytes, so a character split over
tokens shows on the token that completes it, and the pieces of a trajectory concatenate to exactly its text.

Byte mapping by the ``tokenizer.json`` decoder type (read with the ``tokenizers`` library, which every HF fast
tokenizer ships): ``ByteLevel`` (GPT-2, Qwen, Llama 3) reverses the byte-to-unicode table; SentencePiece-style
decoders (``Metaspace``, or a ``Sequence`` with ``ByteFallback``) turn ``▁`` into a space and ``<0xAB>`` into that
byte; added tokens (``<|im_end|>``) are their content; anything else falls back to ``decode([id])``.
"""

from __future__ import annotations

import codecs
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

_BYTE_FALLBACK_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode``: printable bytes map to themselves, the others to 256+i."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def _decoder_kind(spec: Any) -> str:
    if not isinstance(spec, dict):
        return "other"
    kind = spec.get("type")
    if kind == "ByteLevel":
        return "bytelevel"
    if kind == "Metaspace":
        return "metaspace"
    if kind == "Sequence":
        kinds = {d.get("type") for d in spec.get("decoders", []) if isinstance(d, dict)}
        if "ByteLevel" in kinds:
            return "bytelevel"
        if "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds:
            return "metaspace"
    return "other"


class TokenDecoder:
    """Maps token ids to display pieces. Build with :meth:`from_path`; ``source`` names the file it came from."""

    def __init__(self, tokenizer: Any, source: str):
        self.tok = tokenizer
        self.source = source
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        spec = json.loads(tokenizer.to_str()).get("decoder")
        self.kind = _decoder_kind(spec)
        self.added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        self.special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        self._bytes: dict[int, bytes | None] = {}
        self._whole: dict[int, str] = {}  # ids whose bytes decode on their own

    @classmethod
    def from_path(cls, path: str | Path) -> "TokenDecoder":
        """Loads ``path`` (a ``tokenizer.json`` or a directory holding one). Raises ``FileNotFoundError`` or
        ``ValueError`` (not a tokenizer file). The file is read by :func:`agentrl.chat.load_tokenizer`, agentrl's one
        way to load a tokenizer."""
        from agentrl.chat import load_tokenizer

        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no tokenizer.json")
        try:
            return cls(load_tokenizer(p).backend_tokenizer, str(p))
        except Exception as e:  # tokenizers raises plain Exception subclasses for bad files
            raise ValueError(f"{p}: not a tokenizers file ({e})") from e

    def token_bytes(self, tid: int) -> bytes | None:
        """The bytes token ``tid`` stands for, or ``None`` for an id outside the vocabulary."""
        if tid in self._bytes:
            return self._bytes[tid]
        out: bytes | None
        if not isinstance(tid, int) or not 0 <= tid < self.vocab_size:
            out = None
        elif tid in self.added:
            out = self.added[tid].encode()
        else:
            piece = self.tok.id_to_token(tid)
            if piece is None:
                out = None
            elif self.kind == "bytelevel":
                table = _byte_decoder()
                try:
                    out = bytes(table[c] for c in piece)
                except KeyError:
                    out = piece.encode()
            elif self.kind == "metaspace":
                m = _BYTE_FALLBACK_RE.match(piece)
                out = bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode()
            else:
                out = self.tok.decode([tid], skip_special_tokens=False).encode()
        self._bytes[tid] = out
        if out is not None:
            try:
                self._whole[tid] = out.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return out

    def pieces(self, ids: list[Any]) -> tuple[list[str], list[int]]:
        """Returns ``(pieces, unknown)``: the text each token shows (they concatenate to the decoded text; a
        token that only starts a multi-byte character shows ``""``) and the positions of ids outside the
        vocabulary (shown as ``⟨id⟩``)."""
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        whole = self._whole
        out: list[str] = []
        unknown: list[int] = []
        pending = False  # the decoder holds the first bytes of a character
        for i, tid in enumerate(ids):
            if not pending:
                text = whole.get(tid)  # a token whose bytes are complete characters: no decoder needed
                if text is not None:
                    out.append(text)
                    continue
            b = self.token_bytes(tid) if type(tid) is int else None
            if b is None:
                out.append(dec.decode(b"", final=True) + f"\u27e8{tid}\u27e9")  # flush a dangling partial char
                unknown.append(i)
                pending = False
                continue
            out.append(dec.decode(b))
            pending = bool(dec.getstate()[0])
        if out and pending:
            out[-1] += dec.decode(b"", final=True)
        return out, unknown


def find_tokenizer(root: Path) -> Path | None:
    """Where a run directory's tokenizer is: a checkpoint's or the warm start's ``model/`` (the trainer copies the
    source model's tokenizer there), else the model named in ``config.yaml`` (``engine.tokenizer``, then
    ``engine.model``; ``tiny`` is the tiny model's directory if it was built). Returns a ``tokenizer.json`` path
    or ``None``."""
    candidates: list[Path] = []
    ckpt_root = root / "checkpoints"
    ckpts = sorted(ckpt_root.glob("step_*/model/tokenizer.json")) if ckpt_root.is_dir() else []
    candidates += ckpts[-1:]
    candidates.append(root / "warmstart" / "model" / "tokenizer.json")
    cfg_file = root / "config.yaml"
    if cfg_file.is_file():
        try:
            import yaml

            cfg = yaml.safe_load(cfg_file.read_text()) or {}
            engine = cfg.get("engine") or {} if isinstance(cfg, dict) else {}
            for key in ("tokenizer", "model"):
                name = engine.get(key) if isinstance(engine, dict) else None
                if name == "tiny":
                    from agentrl.models.tiny import default_model_dir

                    candidates.append(default_model_dir() / "tokenizer.json")
                elif isinstance(name, str) and name:
                    candidates.append(Path(name).expanduser() / "tokenizer.json")
        except Exception:  # a damaged config.yaml only costs the token text
            pass
    for c in candidates:
        if c.is_file():
            return c
    return None

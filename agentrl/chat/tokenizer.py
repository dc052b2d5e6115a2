"""Loading a model's tokenizer so that its ids are the ones its ``tokenizer.json`` defines.

Some published models declare a ``tokenizer_class`` that disagrees with their ``tokenizer.json`` (DeepSeek-V3's
config says ``LlamaTokenizerFast`` over a byte-level BPE). ``AutoTokenizer`` then builds that class, whose own
normalizer / pre-tokenizer defaults can replace the file's, and the ids differ from the ones the model was trained
on. :func:`load_tokenizer` loads as ``AutoTokenizer`` does, checks a probe text against ``tokenizer.json`` read by
the ``tokenizers`` library itself, and on a mismatch loads the file through the generic fast tokenizer instead.

Every tokenizer agentrl loads comes from :func:`load_tokenizer` (tests/chat/test_tokenizer_loading.py fails on a
direct ``AutoTokenizer`` / ``from_pretrained`` / ``Tokenizer.from_file`` anywhere else): a second loading path is
how ``agentrl train`` once fed DeepSeek episodes other ids than the engine and the chat module used.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PROBE = "Hello world!\n\n  x = f(1, 2)  # ok\t<tool_call> naïve 你好 ```py\nprint('x')```"


def tokenizer_matches_file(tokenizer: Any, tokenizer_json: str | os.PathLike) -> bool:
    """Returns whether ``tokenizer`` encodes (and decodes) a probe text like ``tokenizer_json`` does."""
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(tokenizer_json))
    try:
        ids = list(tokenizer(_PROBE, add_special_tokens=False)["input_ids"])
    except Exception:  # a class rebuilt from the file with its own defaults may not even encode (missing <unk>)
        return False
    return ids == ref.encode(_PROBE, add_special_tokens=False).ids


def load_tokenizer(path: str | os.PathLike, **kwargs: Any) -> Any:
    """Returns the tokenizer of the model directory ``path`` (see the module docstring), or of the ``tokenizer.json``
    file ``path`` (the file as it is, without a chat template: its ``backend_tokenizer`` is the file's tokenizer)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if Path(path).is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(path), clean_up_tokenization_spaces=False, **kwargs)
    tj = Path(path) / "tokenizer.json"
    try:
        tok = AutoTokenizer.from_pretrained(str(path), **kwargs)
    except Exception:
        if not tj.is_file():
            raise
        # The declared class cannot build itself from this tokenizer.json (e.g. a SentencePiece class over a
        # byte-level file): the generic fast tokenizer reads the file as it is.
        log.warning("%s: the declared tokenizer class fails to load; reading tokenizer.json as it is", path)
        tok = PreTrainedTokenizerFast.from_pretrained(str(path), **kwargs)
    if tj.is_file() and not tokenizer_matches_file(tok, tj):
        fixed = PreTrainedTokenizerFast.from_pretrained(str(path), **kwargs)
        if not tokenizer_matches_file(fixed, tj):
            raise ValueError(f"{path}: neither {type(tok).__name__} nor the generic fast tokenizer reproduces "
                             f"tokenizer.json; check tokenizer_config.json's tokenizer_class")
        if not getattr(fixed, "chat_template", None):
            fixed.chat_template = getattr(tok, "chat_template", None)
        tok = fixed
    return tok

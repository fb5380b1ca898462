"""Segmenters: cut generated token sequences into the spans that rewards land on.

A segmenter maps the per-token texts of one response to the indices of the tokens that END a
span (``SegmentFn = (texts) -> [index, ...]``). :func:`segment` applies one to a (B, T) batch:
it cleans the indices (sorted, unique, inside the response), always closes the final span on
the last valid token, and returns each span's text, decoded without special tokens, so a reward
source judges exactly the spans its scores will land on. Span texts concatenate to the
response's text.

The builders below give every granularity's segmenter (see :mod:`creditrl.rewards.placement`);
they are ``functools.partial`` objects over module-level functions, so that they pickle (worker
processes can receive them).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

SegmentFn = Callable[[Sequence[str]], list[int]]  # per-token texts of a response -> span-end indices
KeyPredicate = Callable[[Sequence[str], int], bool]  # (per-token texts, i) -> is token i a key token?


@dataclass
class Segmentation:
    end_mask: torch.Tensor  # bool (B, T), True on span-end tokens
    ends: list[list[int]]  # per response, indices of span-end tokens (ascending)
    texts: list[list[str]]  # per response, the text of each span


class TokenTexts:
    """Cached per-id decoding (special tokens decode to the empty string)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special = set(tokenizer.all_special_ids)
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = "" if token_id in self.special else self.tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


def step_stop_ids(tokenizer: PreTrainedTokenizerBase, separator: str) -> tuple[int, ...]:
    """The ids of every (non-special) token whose text contains ``separator``: passed as
    ``SamplingParams.stop_ids``, they stop a continuation at the end of one step, exactly where
    :func:`separator_segmenter` would end the step. Raises ValueError when no token does."""
    if not separator:
        raise ValueError("step_stop_ids needs a non-empty step separator")
    texts = TokenTexts(tokenizer)
    ids = tuple(i for i in range(len(tokenizer)) if separator in texts(i))
    if not ids:
        raise ValueError(f"no token of the tokenizer contains the step separator {separator!r}")
    return ids


def _ends_on_separator(separator: str, texts: Sequence[str]) -> list[int]:
    return [i for i, t in enumerate(texts) if separator in t]


def _ends_every_k(k: int, texts: Sequence[str]) -> list[int]:
    return list(range(k - 1, len(texts), k))


def _ends_everywhere(texts: Sequence[str]) -> list[int]:
    return list(range(len(texts)))


def _ends_last(texts: Sequence[str]) -> list[int]:
    return [len(texts) - 1] if texts else []


def _ends_on_key(predicate: KeyPredicate, texts: Sequence[str]) -> list[int]:
    return [i for i in range(len(texts)) if predicate(texts, i)]


def _previous_ends_with(suffix: str, texts: Sequence[str], i: int) -> bool:
    return i > 0 and texts[i - 1].endswith(suffix)


def separator_segmenter(separator: str) -> SegmentFn:
    """Span ends = tokens whose text contains ``separator`` (reasoning steps, e.g. ``;``)."""
    if not separator:
        raise ValueError("separator must be a non-empty string")
    return partial(_ends_on_separator, separator)


def block_segmenter(k: int) -> SegmentFn:
    """Fixed blocks of ``k`` tokens: span ends at k-1, 2k-1, ... (the rest closes at the end)."""
    if k < 1:
        raise ValueError(f"block size must be >= 1, got {k}")
    return partial(_ends_every_k, k)


def token_segmenter() -> SegmentFn:
    """Every token ends a span (one span per token)."""
    return _ends_everywhere


def last_token_segmenter() -> SegmentFn:
    """Only the last token ends a span: one span, the whole response."""
    return _ends_last


def key_token_segmenter(predicate: KeyPredicate) -> SegmentFn:
    """Span ends = tokens i with ``predicate(texts, i)``; the last token closes the rest."""
    return partial(_ends_on_key, predicate)


def after_text(suffix: str) -> KeyPredicate:
    """Predicate "the previous token's text ends with ``suffix``".

    ``after_text("=")`` marks the token right after ``=``: in arithmetic, the first character of
    a step's result, where the step's correctness is decided.
    """
    if not suffix:
        raise ValueError("after_text needs a non-empty string")
    return partial(_previous_ends_with, suffix)


# Folders searched for ``module.py`` when a ``module:attribute``'s module is not importable, before
# the working directory: a run's config folder (``creditrl train CONFIG`` adds it).
CALLABLE_FOLDERS: list[Path] = []


def add_callable_folder(folder: str | Path) -> None:
    """Search ``folder`` for the modules of ``module:attribute`` names (see :func:`load_callable`)."""
    path = Path(folder).resolve()
    if path not in CALLABLE_FOLDERS:
        CALLABLE_FOLDERS.append(path)


class _NotFound(ValueError):
    """The module of a ``module:attribute`` name was not found (the message says where it looked)."""


def _import_file(path: Path, name: str | None = None) -> Any:
    """The module in file ``path``, imported once under ``name`` (default: the file's stem, or a
    name of its own if another module has that name); its folder joins ``sys.path`` (the end),
    so it can import its siblings."""
    path = path.resolve()
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    name = name or path.stem
    if name in sys.modules:
        name = f"_creditrl_file_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(module_name: str, spec: str) -> Any:
    """The module of ``spec``: a file (``path/to/file.py``), an importable module, or a
    ``module.py`` in :data:`CALLABLE_FOLDERS` or the working directory."""
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise _NotFound(f"cannot import '{spec}': file '{module_name}' does not exist")
        return _import_file(path)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise  # the module exists; something it imports does not
        folders = [*CALLABLE_FOLDERS, Path.cwd()]
        relative = Path(*module_name.split(".")).with_suffix(".py")
        for folder in folders:
            if (folder / relative).is_file():
                return _import_file(folder / relative, module_name)
        where = ", ".join(dict.fromkeys(str(f) for f in folders))
        raise _NotFound(
            f"cannot import module '{module_name}' named in '{spec}': not on sys.path nor in {where}; "
            f"name a file as path/to/{relative}:{spec.partition(':')[2]}"
        ) from None


def load_callable(spec: str) -> Callable[..., Any]:
    """Import the callable named by ``"package.module:attribute"`` (the attribute may be dotted).

    The module is importable, or a ``module.py`` in one of :data:`CALLABLE_FOLDERS` (the config's
    folder) or the working directory; ``"path/to/file.py:attribute"`` names a file (relative to
    the working directory).

    Raises:
        ValueError: naming ``spec`` and what is wrong: no ``:``, the module cannot be found (and
            where it was looked for) or imported, the attribute is missing, or it is not callable.
    """
    module_name, colon, attr_path = spec.rpartition(":") if spec.count(":") > 1 else spec.partition(":")
    if not colon or not module_name or not attr_path:
        raise ValueError(f"'{spec}' is not of the form 'package.module:attribute'")
    try:
        obj: Any = _import_module(module_name, spec)
    except _NotFound:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to import (syntax error, a missing dependency, ...)
        raise ValueError(f"cannot import module '{module_name}' named in '{spec}': {exc}") from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"'{spec}': '{module_name}' has no attribute '{attr_path}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"'{spec}' is not callable (it is a {type(obj).__name__})")
    return obj


def segment(
    response_ids: torch.Tensor,
    response_lengths: torch.Tensor,
    texts_of: TokenTexts | Callable[[int], str],
    segment_fn: SegmentFn,
) -> Segmentation:
    """Split every response into spans with ``segment_fn``.

    response_ids long (B, T), response_lengths long (B,). ``segment_fn`` sees the texts of the
    valid tokens only; indices it returns outside ``[0, length)`` are dropped, duplicates
    merged, and the last valid token always closes the final span. An empty response has no
    span.
    """
    if response_ids.dim() != 2 or response_lengths.shape != response_ids.shape[:1]:
        raise ValueError(
            f"expected response_ids (B, T) and response_lengths (B,), got "
            f"{tuple(response_ids.shape)} and {tuple(response_lengths.shape)}"
        )
    end_mask = torch.zeros(response_ids.shape, dtype=torch.bool)
    all_ends: list[list[int]] = []
    all_texts: list[list[str]] = []
    for k, (row, length) in enumerate(zip(response_ids.tolist(), response_lengths.tolist())):
        tok_texts = [texts_of(i) for i in row[:length]]
        ends = sorted({e for e in segment_fn(tok_texts) if 0 <= e < length})
        if length and (not ends or ends[-1] != length - 1):
            ends.append(length - 1)
        starts = [0] + [e + 1 for e in ends[:-1]]
        end_mask[k, ends] = True
        all_ends.append(ends)
        all_texts.append(["".join(tok_texts[s : e + 1]) for s, e in zip(starts, ends)])
    return Segmentation(end_mask=end_mask, ends=all_ends, texts=all_texts)

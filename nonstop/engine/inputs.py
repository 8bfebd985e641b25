"""What the Python API takes as prompts, token ids and engine sizes: checked and normalised, never coerced.

A token id is an int, a numpy integer or a 0-d integer tensor (``operator.index``); floats, bools and
strings are refused with the position they sit at, not truncated or split into characters. One prompt of
ids is a list of them or a 1-D integer array / tensor; several are a list of those or a 2-D array / tensor.
``max_batch`` and ``prefill_chunk`` are integers >= 1 (0 slots would admit nothing and never finish).
"""

from __future__ import annotations

import operator

import torch


def _positive_index(value, name: str, also: str = "") -> int:
    """``value`` as an int >= 1 (a TypeError for a non-integer or a bool, a ValueError below 1); ``also``
    names what else the argument takes, for the message."""
    if isinstance(value, bool) or not _is_index(value):
        raise TypeError(f"{name} must be an integer >= 1{also}, got {type(value).__name__} {value!r}")
    if operator.index(value) < 1:
        raise ValueError(f"{name} must be an integer >= 1{also}, got {value!r}")
    return operator.index(value)


def check_max_batch(value, name: str = "max_batch") -> int:
    """``value`` as an int >= 1 (sequences decoded together: 0 would admit none and never finish)."""
    return _positive_index(value, name)


def check_prefill_chunk(value) -> int | None:
    """``value`` as an int >= 1, or None (whole prompts in one forward)."""
    return check_optional_count(value, "prefill_chunk", "whole prompts")


def check_optional_count(value, name: str, none_means: str) -> int | None:
    """``value`` as an int >= 1, or None (which means ``none_means``, for the message)."""
    return None if value is None else _positive_index(value, name, f" or None ({none_means})")


def check_flag(value, name: str) -> bool:
    """``value`` as a bool: True or False (numpy's too), never a truthy string such as "no"."""
    if isinstance(value, bool) or _is_numpy_bool(value):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def _is_numpy_bool(value) -> bool:
    """numpy's bool scalar (``np.bool_``; numpy 2 names its type ``bool``), without importing numpy."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def _is_index(value) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def prompt_list(prompts) -> list[str]:
    """``prompts`` (one string or an iterable of strings) as a list of strings."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray, memoryview)):
        raise TypeError(f"prompts must be a string or a list of strings, got {type(prompts).__name__}: decode it first")
    if isinstance(prompts, dict) or not _iterable(prompts):
        raise TypeError(
            f"prompts must be a string or a list of strings, got {type(prompts).__name__} "
            "(token ids go in prompt_token_ids)"
        )
    out = list(prompts)
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise TypeError(
                f"prompts[{i}] must be a string, got {type(p).__name__} {p!r}"
                + (" (token ids go in prompt_token_ids)" if _token_like(p) else "")
            )
    return out


def _iterable(value) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _is_array(value) -> bool:
    """A numpy array or torch tensor (anything with ``ndim`` and ``dtype``)."""
    return hasattr(value, "ndim") and hasattr(value, "dtype") and hasattr(value, "tolist")


def _is_bool_dtype(value) -> bool:
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def _integer_dtype(array) -> bool:
    """Whether a numpy array's / torch tensor's elements are integers (bool is not)."""
    dtype = array.dtype
    if isinstance(dtype, torch.dtype):
        return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    return getattr(dtype, "kind", "") in ("i", "u")


def _is_sequence(value) -> bool:
    """A container of token ids (a list, tuple, 1-D+ array...), not a string or a single id."""
    if isinstance(value, (str, bytes, bytearray, memoryview, dict)):
        return False
    if _is_array(value):
        return value.ndim > 0
    return _iterable(value)


def _token_like(value) -> bool:
    """One token id: an int (not a bool), a numpy integer or a 0-d integer array / tensor."""
    if isinstance(value, bool) or _is_bool_dtype(value) or (_is_array(value) and value.ndim != 0):
        return False
    return _is_index(value)


def _token_id(value, where: str) -> int:
    """``value`` (at ``where``) as a token id, or a TypeError saying what it is."""
    if _token_like(value):
        return operator.index(value)
    if _is_array(value) and value.ndim:
        what = f"a {value.ndim}-D array of {value.dtype}"
    else:
        what = f"{type(value).__name__} {value!r}"
    raise TypeError(f"{where} is {what}: token ids must be integers (int, numpy or torch integers)")


def id_list(ids, where: str) -> list[int]:
    """One prompt's token ids (a sequence of ids, or a 1-D integer numpy array / torch tensor) as ints."""
    if isinstance(ids, (str, bytes, bytearray, memoryview, dict)) or not _iterable(ids):
        raise TypeError(f"{where} must be a list of token ids (ints), got {type(ids).__name__} {ids!r}")
    if _is_array(ids):
        if ids.ndim != 1:
            raise TypeError(f"{where} must be a list of token ids or a 1-D integer array, got a {ids.ndim}-D array")
        if not _integer_dtype(ids):
            raise TypeError(f"{where} is an array of {ids.dtype}: token ids must be integers")
        return [int(t) for t in ids.tolist()]
    ids = list(ids)
    if all(type(t) is int for t in ids):  # the common case, checked fast
        return ids
    return [_token_id(t, f"{where}[{i}]") for i, t in enumerate(ids)]


def prompt_id_lists(prompt_token_ids) -> list[list[int]]:
    """``prompt_token_ids`` as one list of ints per prompt: token ids (one prompt: a list, a 1-D integer array
    or tensor) or several (a list of those, or a 2-D integer array / tensor)."""
    name = "prompt_token_ids"
    if _is_array(prompt_token_ids):
        if prompt_token_ids.ndim == 1:
            return [id_list(prompt_token_ids, name)]
        if prompt_token_ids.ndim == 2:
            return [id_list(row, f"{name}[{i}]") for i, row in enumerate(prompt_token_ids)]
        raise TypeError(f"{name} must be a 1-D (one prompt) or 2-D (several) array, got {prompt_token_ids.ndim}-D")
    if isinstance(prompt_token_ids, (str, bytes, bytearray, memoryview, dict)) or not _iterable(prompt_token_ids):
        raise TypeError(
            f"{name} must be a list of token ids (one prompt) or a list of such lists, got "
            f"{type(prompt_token_ids).__name__} {prompt_token_ids!r}"
        )
    items = list(prompt_token_ids)
    if not items:
        return []
    if not _is_sequence(items[0]):  # token ids: one prompt
        return [id_list(items, name)]
    return [id_list(p, f"{name}[{i}]") for i, p in enumerate(items)]

"""Names typed with a character that only looks like ASCII: `dispatcher=hybridеp` (a Cyrillic е).

Every config group option, enum value and config key is ASCII, so a non-ASCII character in one
is a look-alike pasted from a document or typed on another keyboard layout. Hydra reports it as
a "token recognition error" (unquoted) or "no such option" (quoted), which hides the cause:
`lookalike_error` names the character, its code point and the name it resembles.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Sequence

# Characters NFKC leaves alone that look like an ASCII one (Cyrillic, Greek, dashes, quotes).
_LOOKS_LIKE = {
    **dict(zip("асеіјорѕхуԁԛԝАВСЕНІЈКМОРЅТХУ", "aceijopsxydqwABCEHIJKMOPSTXY", strict=True)),
    **dict(zip("αοιντρκΑΒΕΗΙΚΜΝΟΡΤΧΥΖ", "aoivtpkABEHIKMNOPTXYZ", strict=True)),
    **dict.fromkeys("‐‑‒–—―−", "-"),
    **dict.fromkeys("‘’‚′", "'"),
    **dict.fromkeys("“”„″", '"'),
    "\u00a0": " ",
    "\u200b": "",
}


def ascii_fold(text: str) -> str:
    """text with each look-alike replaced by the ASCII character it resembles."""
    folded = unicodedata.normalize("NFKC", text)  # fullwidth ｍｂｓ -> mbs, ligatures -> letters
    return "".join(_LOOKS_LIKE.get(char, char) for char in folded)


def describe(char: str) -> str:
    """`'е' is U+0435 CYRILLIC SMALL LETTER IE, a look-alike of 'e'`."""
    looks = ascii_fold(char)
    like = f", a look-alike of {looks!r}" if looks != char and looks.isascii() else ""
    return f"{char!r} is U+{ord(char):04X} {unicodedata.name(char, 'unnamed character')}{like}"


def lookalike(typed: str, candidates: Sequence[str]) -> str | None:
    """The candidate `typed` was meant to be: the one it folds to, else the closest by spelling."""
    folded = ascii_fold(typed)
    if folded in candidates:
        return folded
    close = difflib.get_close_matches(folded, list(candidates), n=1, cutoff=0.75)
    return close[0] if close else None


# ASCII characters that look alike in many fonts: capital I, small l, small i, one and the bar; capital
# O, small o and zero. A name typed with one for another (hybrIdep, gb2OO, a11toall) is a look-alike too.
_SKELETON = str.maketrans({"I": "1", "l": "1", "i": "1", "|": "1", "O": "0", "o": "0"})


def skeleton(text: str) -> str:
    """What `text` looks like: look-alikes folded to one character each, case ignored."""
    return ascii_fold(text).translate(_SKELETON).casefold().translate(_SKELETON)


def meant(typed: str, candidates: Sequence[str]) -> str | None:
    """The candidate `typed` looks like (the same skeleton), else the one closest in spelling, else
    None: what a did-you-mean suggests, never simply the first candidate."""
    shapes = {skeleton(c): c for c in candidates}
    if skeleton(typed) in shapes:
        return shapes[skeleton(typed)]
    close = difflib.get_close_matches(skeleton(typed), list(shapes), n=1, cutoff=0.75)
    return shapes[close[0]] if close else None


def closest(typed: str, candidates: Sequence[str], n: int = 3) -> list[str]:
    """The `n` candidates nearest `typed`, best first: most `_`-separated parts in common
    (qwen3_vl_30b_gb200 shares model, size and GPU with the 8-GPU GB200 recipes), then spelling."""
    parts = set(typed.split("_"))

    def score(candidate: str) -> tuple[int, float]:
        return len(parts & set(candidate.split("_"))), difflib.SequenceMatcher(None, typed, candidate).ratio()

    return sorted(candidates, key=score, reverse=True)[:n]


def lookalike_error(
    what: str, typed: str, candidates: Sequence[str], fixed: str, kind: str = "option"
) -> str | None:
    """One line for a non-ASCII `typed` (a key, option or value), or None when it is ASCII.

    what: how the user wrote it (`dispatcher=hybridеp`); fixed: that line with `{}` where the
    suggested name goes (`dispatcher={}`); kind: what the candidates are (option, key, value).
    """
    odd = list(dict.fromkeys(char for char in typed if not char.isascii()))
    if not odd:
        return None
    chars = ", ".join(describe(char) for char in odd)
    meant = lookalike(typed, candidates)
    if meant is None:
        shown = ", ".join(candidates[:12]) + (", ..." if len(candidates) > 12 else "")
        return f"{what}: {chars}; no {kind} resembles {typed!r}. Allowed: {shown}. Fix: retype it in ASCII."
    return f"{what}: {chars}; you mean the {kind} {meant}. Fix: retype it: {fixed.format(meant)}."

"""Characters a terminal does not show as themselves.

A tower's name is how people pick it, so a name must look like what it is:
``name_problem`` refuses control characters, format characters (zero-width
space, joiners, bidirectional controls, BOM), surrogates, private-use and
unassigned code points (Unicode category C) and letters that draw nothing
(the Hangul fillers), as ``rngrid trust`` does for the names it records.
Text heard from the network is shown with ``hidden(text, i)`` characters
escaped (cli/common.py visible): controls, format characters and blank
letters; a zero-width joiner is kept only between two symbols, where it joins
an emoji sequence (Unicode TR51) that a model's answer may hold.
"""

import unicodedata

#: Letters that draw nothing (Unicode's Hangul fillers), used to fake blank or look-alike names.
BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
ZWJ = "\u200d"


def hidden(text: str, i: int) -> bool:
    """Whether ``text[i]`` shows nothing of itself (see the module doc)."""
    c = text[i]
    if c in BLANK_LETTERS:
        return True
    category = unicodedata.category(c)
    if category == "Cf" and c == ZWJ and 0 < i < len(text) - 1:
        return not (unicodedata.category(text[i - 1]) == "So" and unicodedata.category(text[i + 1]) == "So")
    return category in ("Cc", "Cf", "Cs")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a tower (a sentence naming the characters), or None."""
    bad = sorted({c for c in name if unicodedata.category(c).startswith("C") or c in BLANK_LETTERS})
    if not bad:
        return None
    return ("a tower name must show as what it is: no control or invisible characters, got "
            + ", ".join(f"U+{ord(c):04X}" for c in bad))

"""core.safetext: control characters from outside never reach a terminal."""
from __future__ import annotations

from core.safetext import REPLACEMENT, safe_text


def test_escape_sequences_osc_and_c1_are_replaced():
    hostile = "h\x1b[2J\x1b]8;;http://evil.example/\x07link\x1b]8;;\x07\x9b31m\r\x08\x00\x7f\u202etxt"
    s = safe_text(hostile)
    assert not any(ord(ch) < 0x20 or 0x7f <= ord(ch) <= 0x9f for ch in s)
    assert "\u202e" not in s
    # every unsafe character becomes one visible replacement; the printable rest stays
    assert s == ("h" + REPLACEMENT + "[2J" + REPLACEMENT + "]8;;http://evil.example/" + REPLACEMENT + "link"
                 + REPLACEMENT + "]8;;" + REPLACEMENT + REPLACEMENT + "31m" + REPLACEMENT * 5 + "txt")


def test_plain_text_and_markup_stay_as_they_are():
    # markup is not this helper's business (rich Text objects are): it must survive unchanged
    assert safe_text("ps1[/bold] é 漢") == "ps1[/bold] é 漢"
    assert safe_text(42) == "42"


def test_cut_to_length_with_an_ellipsis():
    assert safe_text("abcdefgh", max_chars=5) == "abcd…"
    assert safe_text("abc", max_chars=5) == "abc"


def test_invisible_and_reordering_characters_are_replaced():
    # bidi marks, line/paragraph separators and zero-width characters make a name look
    # like another or break a line without a newline
    for ch in "\u061c\u200b\u200c\u200d\u200e\u200f\u2028\u2029\u2060\u2066\u2069\ufeff":
        assert safe_text(f"ps{ch}0") == f"ps{REPLACEMENT}0", repr(ch)

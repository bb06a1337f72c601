"""Text from outside (traced bytes, other hosts' snapshots and run dirs) made safe for a terminal.

    from core.safetext import safe_text
    Text(safe_text(host))            # rich: a Text object, never markup

A terminal obeys what it is sent: ESC starts CSI sequences (`ESC[2J` clears the
screen, others move the cursor or rewrite the title), OSC 8 makes hyperlinks,
BEL rings, CR/BS overwrite what was drawn, and the C1 controls (U+0080-U+009F)
are 8-bit forms of the same on some terminals. Bidirectional overrides
(U+202A-U+202E, U+2066-U+2069) reorder what is shown ("Trojan Source"). Every
such character becomes U+FFFD, so the string is still visibly wrong but can do
nothing. Markup is a separate danger: these strings must still go into rich
`Text` objects (or `rich.markup.escape`), never into markup-parsed strings.
"""
from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
# C0 (tab and newline included: a value is one cell on one line), DEL, C1, bidi
# controls and marks (U+061C, U+200E/F), line and paragraph separators (U+2028/9),
# zero-width characters that hide a difference (U+200B-D, U+2060-2064, U+FEFF)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def safe_text(value: object, max_chars: int | None = None) -> str:
    """str(value) with every control character replaced; cut to max_chars (with an ellipsis)."""
    s = value if isinstance(value, str) else str(value)
    if max_chars is not None and len(s) > max_chars:
        s = s[:max(0, max_chars - 1)] + "…"
    return _UNSAFE.sub(REPLACEMENT, s)

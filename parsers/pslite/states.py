"""States of the ps-lite stream parser and the kinds of work it queues (shared by
parser.py, which walks frames, and resync.py, which finds sync again)."""

# what the next bytes are
_GREETING, _HEADER, _META, _COMMAND, _KEYS_SMALL, _KEYS, _SKIP, _HUNT, _OPAQUE = range(9)
# work items: data to parse, bytes lost (gap), bytes discarded past a replay's cap
_DATA, _GAP, _DISCARD = range(3)

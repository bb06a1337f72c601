"""What the library's fast decoders are tested against: references written for clarity."""

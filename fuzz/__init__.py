"""Fuzz targets for everything that reads bytes pslat does not control.

A target is a module of this package listed in `fuzz.targets.TARGETS`. It has:

- `KIND`: "parser" (bytes from the wire or the kernel: `make fuzz` gives each at
  least 1M inputs) or "reader" (files and endpoints from other hosts);
- `seeds() -> list[bytes]`: starting inputs, from recorded data under tests/data;
- `one_input(data: bytes) -> None`: feeds one input to the code under test and
  raises only on a bug. The refusals the code is meant to give (a UserError from a
  reader, say) are caught inside the target; anything else escaping is a crash.

Two drivers run the targets: `fuzz.brief` (fixed seeds, seconds per target,
in-process, from `make test`) and `python -m fuzz` (`make fuzz`: coverage-guided
with atheris in a child process per target, a time and an input budget, per-input
timeout and an RSS limit). Inputs that crashed are kept under
tests/data/fuzz/<target>/ and replayed by the unit tests forever after.
"""

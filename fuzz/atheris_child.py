"""One target under atheris (libFuzzer), in a process of its own: `python -m
fuzz.atheris_child NAME LIBFUZZER_ARGS...`. The code under test is imported inside
atheris.instrument_imports so coverage guides the mutations."""
from __future__ import annotations

import sys


def main() -> None:
    import atheris

    from fuzz.targets import TARGETS

    name = sys.argv[1]
    with atheris.instrument_imports(include=["parsers", "agent", "reports", "probes", "fuzz"]):
        import importlib
        target = importlib.import_module(TARGETS[name])
    atheris.Setup([sys.argv[0]] + sys.argv[2:], target.one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

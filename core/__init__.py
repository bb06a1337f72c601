"""What every stage uses and none owns: the error type users see (errors.py) and the
text made safe to print (safetext.py). Upstream of probes/, parsers/, agent/ and
reports/ alike (DESIGN.md, "Layout": imports follow the data)."""

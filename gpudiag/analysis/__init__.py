"""The analysis of a capture, one subpackage per stage; :mod:`gpudiag.analysis.pipeline` runs them in
order (open it first). A stage imports only the stages above it: ingest, attribution, roofline,
steps, ranks, fusion, rules, report (tests/test_layout.py checks it). ``errors`` is shared by all;
``gate`` compares two reports and imports no stage."""

"""Stage 8: report.json: the findings, the sections around them, the bare-run corrections and the
invariants every report must satisfy."""

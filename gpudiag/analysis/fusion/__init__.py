"""Stage 6: fusion candidates, from the op data flow (dataflow) or the kernel sequence alone."""

"""Stage 2: steps, and every kernel to its step, phase, module and aten op (NVTX ranges through the
launch call; compiled graphs through Inductor's provenance); kernel families from names."""

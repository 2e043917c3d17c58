"""Stage 5: collectives of one process (comm) and every process of an export side by side (processes)."""

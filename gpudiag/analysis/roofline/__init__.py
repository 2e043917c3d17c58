"""Stage 3: device peaks, op costs and each kernel compute-, bandwidth- or overhead-bound."""

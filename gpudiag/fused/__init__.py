"""Reference fused kernels (Triton) that gpudiag recommends for the fusion candidates it finds.

One module per kernel in :mod:`gpudiag.fused.ops`, each with the Triton kernel(s), the launcher,
an autograd Function, a drop-in function, and the PyTorch reference it must match. The registry
(:mod:`gpudiag.fused.registry`) ties them to the pattern names the candidate matcher uses.
Tested on the CPU in Triton's interpreter (``TRITON_INTERPRET=1``) and timed on the GPU by
``benchmarks/bench_kernels.py``.

:mod:`gpudiag.fused.custom_ops` (and ``custom_ops_swin``) registers them as PyTorch custom ops
(``torch.ops.gpudiag.*``) so patched models compile without graph breaks; :mod:`gpudiag.fused.hf`
and :mod:`gpudiag.fused.timm_swin` patch Hugging Face and timm models with them.
"""

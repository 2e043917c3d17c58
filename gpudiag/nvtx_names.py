"""The NVTX range texts gpudiag injects, shared by the capture stage (which emits them) and the
readers (which parse them). Every injected range starts with ``gpudiag:`` so it never collides with
the user's own ranges.

Formats (one line each):
- step:   ``gpudiag:step 3``                      (NVTX start/end range, not thread-bound)
- phase:  ``gpudiag:phase backward``              (push/pop on the thread that called backward/step)
- closure: ``gpudiag:closure``                     (push/pop around each closure ``optimizer.step(closure)``
          evaluates; the optimizer phase range is closed while it runs)
- module: ``gpudiag:module layers.0.attn|WindowAttention``  (qualified path | class name)
- op:     ``gpudiag:op {"op":"aten::mm","in":["bfloat16[32,768]@7f3a2c000000",...]}``  (JSON; each
          tensor as dtype[shape]@storage address, for the data-dependency analysis)
- out:    ``gpudiag:out "bfloat16[32,3072]@7f3a2c400000"``  an empty range nested at the end of its op's range,
          holding the op's outputs (JSON), which are known only after the call
"""

PREFIX = "gpudiag:"
STEP = PREFIX + "step "
PHASE = PREFIX + "phase "
MODULE = PREFIX + "module "
OP = PREFIX + "op "
OUT = PREFIX + "out "
TAIL = PREFIX + "tail"
CLOSURE = PREFIX + "closure"  # push/pop around a closure optimizer.step(closure) evaluates (its work is not the optimizer's)
# push/pop around each run of an Inductor-compiled graph: ``gpudiag:graph 3``; a dynamic-shape graph adds
# its size symbols' values: ``gpudiag:graph 3 s33=8``
GRAPH = PREFIX + "graph "

PHASES = ("forward", "backward", "optimizer")

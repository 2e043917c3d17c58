"""GPT-2 (124M) greedy decoding with CUDA graphs (HF transformers, random init, no download).

    python benchmarks/zoo/gpt2_decode_graphs.py --steps 32                  # torch.compile(mode="reduce-overhead")
    python benchmarks/zoo/gpt2_decode_graphs.py --steps 32 --user-graph     # the user's own torch.cuda.graph
    python benchmarks/zoo/gpt2_decode_graphs.py --steps 32 --eager          # no graphs, for comparison
    gpudiag profile benchmarks/zoo/gpt2_decode_graphs.py -- --steps 32
    python benchmarks/zoo/gpt2_decode_graphs.py --tiny --device cpu --steps 4 --backend aot_eager  # smoke test

``GPT2LMHeadModel`` from ``GPT2Config()`` (124M, SDPA attention), bf16, batch 4, a 128-token random
prompt, greedy decoding under ``torch.no_grad()``. One step is one generated token and ends with
``gpudiag.step()`` (a no-op when gpudiag is not installed or not profiling). Step 0 is the prefill
(run eagerly), which yields the first token.

Two decode loops (``--cache``):

- ``static``: transformers' ``StaticCache`` (a fixed-size KV cache updated in place), prefill
  eagerly, then one token per call of the compiled model, with explicit ``position_ids`` (and
  ``cache_position`` where the model's forward takes it). Needs a GPT-2 that accepts Cache objects
  (transformers >= 4.53 or so); before it is used, one cached decode is checked in fp32 against a
  forward over the whole sequence.
- ``window``: no KV cache. Each step runs the model on a fixed window of the last 128 tokens and
  appends the argmax, so every call has the same shapes: works with any transformers version.

``--cache auto`` (default) takes ``static`` when that check passes and says why not otherwise.
``--user-graph`` captures the model's forward over the window with ``torch.cuda.graph`` (static
input buffer, replay per token) instead of torch.compile; it always uses the window loop.

Prints ``step N checksum X tokens ...`` per step (after the loop; the checksum is the mean absolute
value of that step's last-position logits) and ``median_step_ms X`` (CUDA events on cuda, wall time
on cpu; the first 3 steps - prefill, compilation, graph recording - are left out).

transformers APIs used: ``GPT2Config``, ``GPT2LMHeadModel``, ``StaticCache`` (constructor arguments
picked by signature: ``config``, ``max_cache_len`` and, where present, ``max_batch_size``/``batch_size``,
``device``, ``dtype``), the forward keywords ``input_ids``, ``past_key_values``, ``position_ids``,
``use_cache``, ``cache_position`` (only if in the signature), and ``.logits`` of the output.
"""

import argparse
import inspect

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

from zoo_common import StepTimer  # benchmarks/zoo/zoo_common.py: next to this script, on sys.path

try:
    from gpudiag import step
except ImportError:  # gpudiag not installed: the script still runs
    step = lambda: None  # noqa: E731


def new_static_cache(model, batch: int, max_len: int, device: torch.device, dtype: torch.dtype):
    """A transformers StaticCache, with the constructor arguments this transformers version takes."""
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": model.config, "max_cache_len": max_len}
    if "max_batch_size" in params:  # 4.45 .. 4.5x (batch_size is its deprecated spelling)
        kwargs["max_batch_size"] = batch
    elif "batch_size" in params:
        kwargs["batch_size"] = batch
    if "device" in params:  # newer versions allocate lazily, on the first update
        kwargs["device"] = device
    if "dtype" in params:
        kwargs["dtype"] = dtype
    return StaticCache(**kwargs)


class StaticDecoder:
    """Calls of the model with a StaticCache: prefill (a whole prompt) and decode (one token)."""

    def __init__(self, model, batch: int, max_len: int, device: torch.device, dtype: torch.dtype):
        self.model, self.batch = model, batch
        self.cache = new_static_cache(model, batch, max_len, device, dtype)
        self.positions = torch.arange(max_len, device=device)
        self.takes_cache_position = "cache_position" in inspect.signature(model.forward).parameters

    def kwargs(self, start: int, length: int) -> dict:
        positions = self.positions[start:start + length]
        kwargs = {"past_key_values": self.cache, "use_cache": True,
                  "position_ids": positions.unsqueeze(0).expand(self.batch, -1)}
        if self.takes_cache_position:
            kwargs["cache_position"] = positions
        return kwargs


def check_static_cache(model, prompt: torch.Tensor) -> str | None:
    """None if a StaticCache decode matches a full forward (fp32), else the reason it cannot be used."""
    batch, length = prompt.shape
    try:
        decoder = StaticDecoder(model, batch, length + 2, prompt.device, torch.float32)
        logits = model(input_ids=prompt, **decoder.kwargs(0, length)).logits[:, -1]
        token = logits.argmax(-1)
        cached = model(input_ids=token[:, None], **decoder.kwargs(length, 1)).logits[:, -1]
        full = model(input_ids=torch.cat([prompt, token[:, None]], 1), use_cache=False).logits[:, -1]
    except Exception as exc:  # noqa: BLE001 - any failure means: use the window loop
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    error = (cached - full).abs().max().item()
    if error > 1e-3 * full.abs().max().item() + 1e-5:
        return f"cached decode differs from the full forward (max |diff| {error:.3g})"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32, help="tokens to generate (one step each)")
    parser.add_argument("--batch", type=int, default=None, help="default 4 (tiny: 2)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt and window length; default 128 (tiny: 8)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 64: runs in seconds on a CPU")
    parser.add_argument("--cache", choices=["auto", "static", "window"], default="auto")
    parser.add_argument("--user-graph", action="store_true", help="own torch.cuda.graph capture instead of torch.compile")
    parser.add_argument("--eager", action="store_true", help="neither torch.compile nor CUDA graphs")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backend (aot_eager: tracing without code generation, for CPU smoke tests)")
    args = parser.parse_args()
    batch = args.batch or (2 if args.tiny else 4)
    prompt_len = args.prompt_len or (8 if args.tiny else 128)
    device = torch.device(args.device)
    if args.user_graph and args.eager:
        parser.error("--user-graph and --eager exclude each other")
    if args.user_graph and args.cache == "static":
        parser.error("--user-graph captures the window loop (a fixed-shape forward without a KV cache): use --cache window")
    if args.user_graph and device.type != "cuda":
        parser.error("--user-graph needs a CUDA device")
    if args.steps < 1:
        parser.error("--steps must be at least 1")

    if args.tiny:
        config = GPT2Config(vocab_size=1024, n_positions=256, n_embd=64, n_layer=2, n_head=4, bos_token_id=1023,
                            eos_token_id=1023, attn_implementation="sdpa")
    else:
        config = GPT2Config(attn_implementation="sdpa")  # the 124M model
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to(device).eval()
    data_gen = torch.Generator().manual_seed(1)  # CPU generator: the same prompt on every device
    prompt = torch.randint(0, config.vocab_size, (batch, prompt_len), generator=data_gen).to(device)

    with torch.no_grad():
        cache_kind, why = args.cache, ""
        if args.user_graph:
            cache_kind = "window"
        elif args.cache in ("auto", "static"):
            reason = check_static_cache(model, prompt)  # in fp32, before the cast to bf16
            if reason is None:
                cache_kind = "static"
            elif args.cache == "static":
                raise SystemExit(f"--cache static: StaticCache does not work here (transformers "
                                 f"{transformers.__version__}): {reason}")
            else:
                cache_kind, why = "window", f" (StaticCache not usable: {reason})"
        model.to(torch.bfloat16)
        graphs = "user torch.cuda.graph" if args.user_graph else ("none (eager)" if args.eager else
                                                                 f"torch.compile reduce-overhead, backend {args.backend}")
        print(f"gpt2_decode_graphs: transformers {transformers.__version__}, batch {batch}, prompt {prompt_len}, "
              f"{args.steps} tokens, device {device}, cache {cache_kind}{why}, graphs: {graphs}", flush=True)

        if args.eager or args.user_graph:
            forward = model
        else:
            compile_kwargs = {"backend": args.backend}
            if args.backend == "inductor":
                compile_kwargs["mode"] = "reduce-overhead"
            forward = torch.compile(model, **compile_kwargs)

        timer = StepTimer(device)
        checksums, tokens = [], []
        if cache_kind == "static":
            decoder = StaticDecoder(model, batch, prompt_len + args.steps, device, torch.bfloat16)
            token = None
            for k in range(args.steps):
                timer.start()
                if k == 0:  # prefill, eager (as transformers' generate does): its last logits give token 0
                    logits = model(input_ids=prompt, **decoder.kwargs(0, prompt_len)).logits[:, -1]
                else:
                    logits = forward(input_ids=token[:, None], **decoder.kwargs(prompt_len + k - 1, 1)).logits[:, -1]
                token = logits.argmax(-1)
                checksums.append(logits.float().abs().mean())
                tokens.append(token)
                timer.stop()
                step()
        elif args.user_graph:
            window = prompt.clone()  # the graph's static input
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the capture (lazy inits, cuBLAS handles)
                for _ in range(3):
                    model(input_ids=window, use_cache=False)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    graph_logits = model(input_ids=window, use_cache=False).logits[:, -1]
            except Exception as exc:
                raise SystemExit(f"--user-graph: capturing GPT-2's forward failed with transformers "
                                 f"{transformers.__version__}: {type(exc).__name__}: {exc}") from exc
            for k in range(args.steps):
                timer.start()
                if k > 0:
                    window.copy_(torch.cat([window[:, 1:], token[:, None]], dim=1))
                graph.replay()
                token = graph_logits.argmax(-1)
                checksums.append(graph_logits.float().abs().mean())
                tokens.append(token)
                timer.stop()
                step()
        else:  # window loop, compiled or eager
            window = prompt
            for k in range(args.steps):
                timer.start()
                if k > 0:
                    window = torch.cat([window[:, 1:], token[:, None]], dim=1)
                logits = forward(input_ids=window, use_cache=False).logits[:, -1]
                token = logits.argmax(-1)
                checksums.append(logits.float().abs().mean())
                tokens.append(token)
                timer.stop()
                step()

    sums = torch.stack(checksums).tolist()
    ids = torch.stack(tokens).tolist()
    for k in range(args.steps):
        print(f"step {k} checksum {sums[k]:.6f} tokens {','.join(str(t) for t in ids[k])}")
    print(f"median_step_ms {timer.median_ms():.3f}")


if __name__ == "__main__":
    main()

"""Here, without a GPU: which changes gpudiag can hand back as a patch for each pt_* script of the
suite, from trial records made up the way the trials write their ``applied`` lines
(gpudiag/trials/apply.py), each patch `git apply --check`ed in a fresh copy of the script's folder.
It predicts the "patch" column of the device table before any device time is spent.

    python benchmarks/patch_suite/probe.py [EXAMPLES_DIR] [-o probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from verify_recorded import git_apply_check  # noqa: E402

# script (relative to EXAMPLES_DIR), the suite's arguments, the model's class as the trials name it
# (the root module gpudiag changes; imagenet's is wrapped in nn.DataParallel on one GPU), the
# optimizer class, and whether its loader has workers
SCRIPTS = {
    "pt_imagenet": ("imagenet/main.py", ["--dummy", "-a", "resnet50", "-b", "64", "--epochs", "1"], "ResNet", "SGD"),
    "pt_word_lm": ("word_language_model/main.py", ["--data", "D", "--accel", "--epochs", "1", "--use-optimizer",
                                                   "--lr", "0.001", "--save", "m.pt"], "RNNModel", "AdamW"),
    "pt_dcgan": ("dcgan/main.py", ["--dataset", "fake", "--accel", "--niter", "3", "--manualSeed", "1", "--outf", "o"],
                 "Generator", "Adam"),
    "pt_mnist": ("mnist/main.py", ["--epochs", "1"], "Net", "Adadelta"),
}


def records(model: str, opt: str) -> dict[str, dict]:
    return {
        "tf32": {"applied": ["torch.backends.cuda.matmul.allow_tf32 = True"]},
        "cudnn-benchmark": {"applied": ["torch.backends.cudnn.benchmark = True"]},
        "fused-optimizer": {"applied": [f"{opt}(fused=True)"]},
        "compile": {"applied": [f"{model}.forward = torch.compile({model}.forward)"]},
        "compile-graphs": {"applied": [f"{model}.forward = torch.compile({model}.forward, mode='reduce-overhead')"]},
        "channels-last": {"applied": [f"{model}.to(memory_format=torch.channels_last) and its 4-D float inputs"]},
        "bf16-autocast": {"applied": [f"{model}.forward under torch.autocast('cuda', dtype=torch.bfloat16)"]},
        "loader-workers": {"applied": ["DataLoader(X): num_workers 0 -> 8, persistent_workers=True, pin_memory=True"],
                           "num_workers": 8},
        "pin-memory": {"applied": ["DataLoader(X): pin_memory=True"]},
    }


def main(argv: list[str] | None = None) -> int:
    from gpudiag.patches import make

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, nargs="?", default=HERE.parent.parent / ".examples")
    parser.add_argument("-o", "--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = {}
    for name, (rel, script_args, model, opt) in SCRIPTS.items():
        script = args.examples / rel
        out[name] = {}
        for change, record in records(model, opt).items():
            patch = make.make_patch(script, change, {"change": change, **record}, script_args)
            entry = {"made": patch.made, "why_not": patch.why_not, "notes": patch.notes}
            if patch.made:
                with tempfile.TemporaryDirectory() as tmp:
                    make.write(Path(tmp), patch)
                    entry["git_apply_check"] = git_apply_check(Path(tmp) / "changes" / f"{change}.patch",
                                                               script.resolve().parent)
            out[name][change] = entry
            print(f"{name:12} {change:16} " + (f"patch, git apply --check {'ok' if entry['git_apply_check'] else 'FAILS'}"
                                               if patch.made else f"no patch: {patch.why_not}"))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

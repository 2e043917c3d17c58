"""Patches: a measured trial change handed back as a unified diff to the user's own files, made
with libcst, verified by running the patched script (docs/patches.md).

- :mod:`gpudiag.patches.locate`: where a change edits (the model, its loops, constructors);
- :mod:`gpudiag.patches.edits`: the edits, made in one libcst pass;
- :mod:`gpudiag.patches.recipes`: one recipe per change;
- :mod:`gpudiag.patches.make`: the patch, its diff and its files in ``RUN_DIR/changes/``;
- :mod:`gpudiag.patches.verify`: the patched script run bare against the unchanged one;
- :mod:`gpudiag.patches.apply`: ``gpudiag apply``.
"""

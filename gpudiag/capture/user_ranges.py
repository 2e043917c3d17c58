"""The user's own NVTX ranges as steps (``--steps-from nvtx:REGEX``, or in auto mode ranges named
``step N``/``iteration N`` when no optimizer step comes first): wraps ``torch.cuda.nvtx.range_push``
and ``range_pop`` (``torch.cuda.nvtx.range`` goes through them) to time each step range, open the
capture range and the detail step's op ranges, and end the window. A step source of the
step-boundary core (:mod:`gpudiag.capture.steps_core`), installed by :mod:`gpudiag.capture.instrument`."""

from __future__ import annotations

import time

from gpudiag.capture import steps_core


def _user_steps(state) -> bool:
    """Whether a user range matching the step regex is a step: always in ``nvtx`` mode; in
    ``auto`` mode, the first one switches to ``nvtx`` mode while no optimizer step has ended a
    step (an inference or generate loop with its own "step N" ranges), dropping a step 0 a
    forward opened; once an optimizer step has, steps stay the optimizer's."""
    if state.step_mode == "nvtx":
        return True
    if not state.auto_nvtx or state.steps_completed > 0:
        return False
    with state.lock:
        if state.step_range is not None:
            state.nvtx.end(state.step_range)
            state.step_range = None
        steps_core.stop_op_ranges(state)
        state.step_index = -1
        state.step_mode = "nvtx"
    return True


def wrap_user_nvtx(state, torch) -> None:
    """In ``nvtx:REGEX`` mode, count the user's matching ranges to know which one is the detail
    step; wraps ``torch.cuda.nvtx.range_push`` (``torch.cuda.nvtx.range`` goes through it)."""
    nvtx_mod = torch.cuda.nvtx
    original_push, original_pop = nvtx_mod.range_push, nvtx_mod.range_pop
    depth_of_step: list[int] = []
    depth = [0]

    def range_push(msg):
        is_step = (steps_core.owns(state) and not state.window.closed and bool(state.step_regex.search(str(msg)))
                   and _user_steps(state))
        if is_step:
            state.window.step_opening(state.step_index + 1)  # the capture range opens before the range
        result = original_push(msg)
        depth[0] += 1
        if is_step:
            state.step_index += 1
            steps_core.announce_step(state)
            state.step_start_ns[state.step_index] = time.perf_counter_ns()
            steps_core.record_event(state.step_start_event, state.step_index)
            depth_of_step.append(depth[0])
            steps_core.start_op_ranges_if_detail(state)
        return result

    def range_pop():
        done = False
        if depth_of_step and depth_of_step[-1] == depth[0] and steps_core.owns(state):  # not in a forked child
            depth_of_step.pop()
            state.step_end_ns[state.step_index] = time.perf_counter_ns()
            steps_core.record_event(state.step_end_event, state.step_index)
            steps_core.stop_op_ranges(state)
            state.steps_completed += 1
            done = state.window.step_closed(state.step_index)
        depth[0] -= 1
        result = original_pop()
        if done:
            state.window.close(state)  # raises WindowComplete unless --run-to-end
        return result

    nvtx_mod.range_push, nvtx_mod.range_pop = range_push, range_pop

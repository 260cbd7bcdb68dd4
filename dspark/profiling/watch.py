"""Serving-time check of the step-time table against measured steps."""

from __future__ import annotations

import statistics

import torch

from .tables import _say


class StepWatch:
    """Serving-time check of the step-time table: each step's wall time against the
    table's prediction for its shape. When the median ratio over `window` steps
    exceeds `factor` (another process took a core, the typical cause), the CPU time of
    other processes is probed and torch falls back to the threads that fit beside it;
    once that load is gone again (probed every `recheck` steps), the threads return.
    `slow_windows` counts windows that ran slow, `fallbacks` thread reductions.

    Without a table (plain decoding has no scheduler and so no profile), a step is
    compared with the fastest step seen so far of about the same size (token counts
    bucketed by powers of two): the same fallback, measured against the process's own
    best instead of a profile."""

    #: steps whose median ratio (measured / table) decides a refresh, and the bound:
    #: a ratio outside [1 / DRIFT_BOUND, DRIFT_BOUND] with no other load on the CPU
    #: rescales the table by it (the table, not the machine, is off)
    DRIFT_WINDOW = 128
    DRIFT_BOUND = 1.5

    def __init__(self, table=None, window: int = 16, factor: float = 3.0, recheck: int = 256, quiet: bool = False,
                 rescale: bool = True):
        self.table = table
        #: False when something else keeps the table true (dspark.schedule.live)
        self.rescale = rescale
        self._best: dict[int, float] = {}  # without a table: fastest step per size bucket
        self.drift_ratios: list[float] = []
        self.refreshes = 0
        self.window = window
        self.factor = factor
        self.recheck = recheck
        self.quiet = quiet
        self.ratios: list[float] = []
        # the threads asked for (a profile on a busy machine may have started with fewer)
        conditions = (table.conditions or {}) if table is not None else {}
        self.threads = int(conditions.get("threads_requested") or torch.get_num_threads())
        self.reduced = torch.get_num_threads() < self.threads
        self.steps_since_probe = 0
        self.slow_windows = 0
        self.fallbacks = 0
        if table is None:
            self._fit_threads_to_load()

    def _fit_threads_to_load(self, why: str = "") -> tuple[bool, float | None]:
        """Probe the other processes' load and drop to the threads that fit beside it.
        Without a table this runs once before the first step too: the fastest steps are
        the reference then, so they must not be measured beside another process (a
        profile probes the same way before it measures). Returns (reduced, busy)."""
        from dspark.profiling.measure import busy_cores, threads_for_load

        busy = busy_cores(0.1)
        fit = threads_for_load(torch.get_num_threads(), busy)
        if fit >= torch.get_num_threads():
            return False, busy
        torch.set_num_threads(fit)
        self.reduced = True
        self.fallbacks += 1
        self.steps_since_probe = 0
        _say(f"{why}other processes keep {busy:.1f} CPU cores busy: using {fit} thread(s)", self.quiet)
        return True, busy

    def _check_drift(self) -> None:
        from dspark.profiling.measure import busy_cores

        ratio = statistics.median(self.drift_ratios)
        self.drift_ratios.clear()
        if 1 / self.DRIFT_BOUND <= ratio <= self.DRIFT_BOUND or self.reduced:
            return
        busy = busy_cores(0.05)
        if busy is not None and busy >= 0.5:
            return  # another process, not the table: the thread fallback handles it
        self.table.scale(ratio)
        self.refreshes += 1
        _say(f"steps ran {ratio:.2f}x the step-time table's times over the last {self.DRIFT_WINDOW} steps with the "
             f"CPU otherwise idle: the table is rescaled to match (refresh {self.refreshes})", self.quiet)

    def record(self, n_tokens: int, n_requests: int, seconds: float) -> None:
        from dspark.profiling.measure import busy_cores, threads_for_load

        if n_tokens <= 0:
            return
        if self.table is not None:
            predicted = self.table.step_time(n_tokens, n_requests)
            if predicted > 0:
                self.ratios.append(seconds / predicted)
                if self.rescale:
                    self.drift_ratios.append(seconds / predicted)
                    if len(self.drift_ratios) >= self.DRIFT_WINDOW:
                        self._check_drift()
        else:
            bucket = max(0, n_tokens - 1).bit_length()
            best = self._best.get(bucket)
            if best is not None:
                self.ratios.append(seconds / best)
            if not self.reduced and (best is None or seconds < best):
                self._best[bucket] = seconds  # only full-thread steps set the reference
        self.steps_since_probe += 1
        if self.reduced and self.steps_since_probe >= self.recheck:
            self.steps_since_probe = 0
            busy = busy_cores(0.05)
            if busy is not None and threads_for_load(self.threads, busy) == self.threads:
                torch.set_num_threads(self.threads)
                self.reduced = False
                _say(f"the other CPU load is gone: back to {self.threads} threads", self.quiet)
        if len(self.ratios) < self.window:
            return
        ratio = statistics.median(self.ratios)
        self.ratios.clear()
        if ratio <= self.factor:
            return
        self.slow_windows += 1
        reference = "the step-time table" if self.table is not None else "the fastest steps so far"
        reduced, busy = self._fit_threads_to_load(f"steps ran {ratio:.1f}x slower than {reference}; ")
        if not reduced:
            _say(f"steps ran {ratio:.1f}x slower than {reference} (other processes on "
                 f"{0.0 if busy is None else busy:.1f} cores); the scheduler's costs are off", self.quiet)

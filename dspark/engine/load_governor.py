"""A costlier mode or its alternative, per load level, decided by measured throughput.

One mechanism, two decisions in the engine (dspark.engine.engine):

* `LLMEngine.speculate_or_plain`: whether a step speculates at all at this load (ON)
  or decodes plainly (OFF; the `plain_fallback` key of the speculative config);
* `LLMEngine.drafter_or_lookup`: where a step speculates, whether the learned drafter
  runs (ON) or the step goes without it (OFF: prompt lookup alone with hybrid drafting,
  a plain step for a drafter alone), scored on the steps between the first one's trials.

What follows tells the first use, where the measurements come from; for the second
read "the drafter on" for speculation and "the drafter off" for plain decoding (the
score's unit stays a plain step's time in both).

The scheduler prices every drafted token with calibrated survivals and a step-time
curve, but some costs sit outside its model (drafting and lookup bookkeeping, the
hidden states kept for the drafter, probes, a calibration that runs ahead of a new
workload), and at high load a decode step is compute-bound, so that a verified token
pays only when it is accepted more often than not. Where speculation cannot win,
these leftovers make it lose a few percent to plain decoding. The governor turns
speculation off for such stretches, by measurement rather than by model:

* pure decode steps (no prompt chunks) are scored by their efficiency: the tokens
  they emitted, each counted as T(R) / R seconds (what a plain step of the same R
  requests takes per token, by the step-time profile as measured at start-up: a fixed
  unit, where the live table would learn count R while plain decoding runs it and
  score the two modes against different references), over the seconds the steps
  took; plain decoding scores about 1 on an undrifted machine, speculation its speedup;
* the engine starts speculating for `min_gap` steps, then runs a trial: the two modes
  alternate in blocks of `trial` / 4 steps in the order A B B A A B B A ... (16
  blocks: 2 x `trial` steps of each), so that the machine's drift and the requests'
  growing lengths fall on both alike, and only the trial's steps are scored. Then
  `gap` steps of whichever scored higher over the latest trials. The gap doubles (up
  to `max_gap`) each time the same mode wins again and falls back to `min_gap` when the
  other one does, so a settled workload spends about 2 x trial / max_gap of its steps
  on the losing mode. (Scored as runs one after the other, minutes apart, the modes
  were compared at different speeds of the machine: at 4 requests, engine alone,
  priced prompt lookup kept speculation for 40 % of its steps on a score 7 % ahead
  while it ran 4 % behind plain decoding, 0.958x plain; paired, 0.983-0.987x:
  docs/journal.md.)

`"plain_fallback": true` governs every load level, each starting with speculation.
Measured on the default model, that settled on plain decoding in a long run at 16
requests where speculation alone was faster (its trials see too few of the bursts in
which lookup pays), and at one request its plain trials cost a few percent. So the
default governs high load only: `"plain_fallback": 8` governs steps of 8 decoding
requests or more (their power-of-two level and those above), and there it starts
with plain decoding. At that load a step is nearly compute-bound, a verified token
pays only when it is accepted nearly always, and speculation's own costs (lookup, the
drafter's probes, the context it is fed) cost more than it returned: in bursts of 32
requests, steps of 16-31 requests ran at 0.89 of plain decoding's efficiency while
speculating; served at 16 requests, whose running count dips below 16 between
requests, governing from 16 left 0.91-0.94x plain and from 8 0.95-1.00x. A
speculation trial still runs after every gap, so a workload where it wins there
(long copies from the prompt) gets it back; a level that starts plain runs its first
gap at `OFF_START_GAPS` (4) times the shortest, as if plain decoding had won that
often already, since its first trial is its dearest.

Below that, `"plain_trials_from": M` governs the levels from M requests up too. Each
such level starts with speculation where the step-time table says verification is
cheap there, and with plain decoding where a step of two tokens per request costs at
least `DEAR_VERIFICATION` (1.2) times a plain one: at 4 requests speculation paid on an
AMX Xeon (1.07-1.13x plain decoding) and lost on an AVX2-only EPYC, where a step of 8
tokens costs 1.3-1.4 times one of 4 (0.87x engine alone at 4 requests, mostly prompt
lookup tokens accepted one time in five). Such a plain start rests on two profiled
times alone, so its first trial comes after the shortest gap (OFF_START_GAPS is for
`plain_fallback`'s levels). The default governs from 2 requests.
Halfway through a trial, one in which speculation runs below `EARLY_EXIT` (0.85) of
plain decoding's efficiency ends there; at a level that started plain (where
speculation is expected to lose) it ends there unless it is level with plain
decoding (`EARLY_EXIT_OFF_START`). Speculation must lead by `ON_MARGIN` and must
also have emitted that many times the other mode's tokens per request and step (plain
decoding's one), a bound on its gain that drift does not move; a mode's score spans its
recent trials (`HISTORY`), and the engine asks for the level its requests are about to
decode at. The history of these choices, measured: docs/journal.md.

Plain mode drafts nothing, verifies nothing and taps no hidden states (the rows are
plain decoding, exact by construction): the requests of a plain-mode step let the
drafter go and keep prompt lookup for any later speculation (`ContextFeed.let_go`).
Decisions use past steps only, so they are lossless like the scheduler's own.
"""

from __future__ import annotations

from typing import Callable

from dspark.schedule.step_time import load_level

#: the two modes a governor chooses between: ON the costlier one (speculation; the
#: drafter), OFF its alternative (plain decoding; the step without the drafter)
ON, OFF = "on", "off"


class LoadGovernor:
    """Whether a costlier mode (`ON`) or its alternative (`OFF`) runs, per load level:
    whether speculation pays depends on how many requests share a step (at one request
    verification is nearly free, at sixteen a step is compute-bound), so each
    power-of-two bucket of the running request count (1, 2-3, 4-7, 8-15, ...) keeps its
    own modes, scores and gaps. `modes` names ON and OFF in `summary()` (what a
    dashboard or a bench prints), so that each use says what its two modes are."""

    #: a governed level below `from_requests` starts with plain decoding when the
    #: step-time table says that verifying a second token per request costs at least this
    #: many times a plain step (verification is dear there: speculation needs most of its
    #: tokens accepted to pay)
    DEAR_VERIFICATION = 1.2

    def __init__(self, trial: int = 32, min_gap: int = 128, max_gap: int = 4096, warmup: int = 4,
                 from_requests: int | None = None, trials_from: int | None = None,
                 step_cost: Callable[[int], float] | None = None,
                 modes: tuple[str, str] = ("speculative", "plain")) -> None:
        """`from_requests` None: every load level governed, each starting with
        speculation; N: the levels of N decoding requests and above, each starting with
        plain decoding. `trials_from` M (< N): the levels from M requests up to N's are
        governed too, starting with speculation (a plain trial after the first gap
        decides), or with plain decoding where `step_cost` (seconds of a target step
        over that many tokens) says verification is dear at the level's request count
        (`DEAR_VERIFICATION`). Below the governed levels speculation is never switched
        off."""
        if (trial < 1 or not 1 <= min_gap <= max_gap or warmup < 0 or (from_requests is not None and from_requests < 1)
                or (trials_from is not None and (from_requests is None or trials_from < 1))):
            raise ValueError("LoadGovernor needs trial >= 1, 1 <= min_gap <= max_gap, warmup >= 0, "
                             "from_requests None or >= 1, and trials_from None or >= 1 with from_requests")
        self._settings = (trial, min_gap, max_gap, warmup)
        self.from_requests = from_requests
        self.from_bucket = 0 if from_requests is None else self.bucket(from_requests)
        self.start = ON if from_requests is None else OFF
        #: the first governed level (those below from_bucket start speculating)
        self.trials_bucket = self.from_bucket if trials_from is None else min(self.bucket(trials_from),
                                                                              self.from_bucket)
        self.step_cost = step_cost
        self.modes = {ON: modes[0], OFF: modes[1]}
        self.levels: dict[int, LoadLevel] = {}

    @staticmethod
    def bucket(num_requests: int) -> int:
        return load_level(num_requests) - 1  # 1 -> 0, 2-3 -> 1, 4-7 -> 2, ...

    def level(self, num_requests: int) -> "LoadLevel":
        b = self.bucket(num_requests)
        if b not in self.levels:
            start = self._start(b)
            # a plain start below from_bucket rests on the curve's prior alone: its first
            # trial comes after the shortest gap (see LoadLevel.OFF_START_GAPS)
            gaps = LoadLevel.OFF_START_GAPS if b >= self.from_bucket else 1
            self.levels[b] = LoadLevel(*self._settings, start=start, off_start_gaps=gaps)
        return self.levels[b]

    def _start(self, b: int) -> str:
        if b >= self.from_bucket:
            return self.start
        r = 2 ** b  # the level's fewest requests
        if self.step_cost is not None and self.step_cost(2 * r) >= self.DEAR_VERIFICATION * self.step_cost(r):
            return OFF
        return ON

    def governs(self, num_requests: int) -> bool:
        return self.bucket(num_requests) >= self.trials_bucket

    def on(self, num_requests: int) -> bool:
        """Whether a step of `num_requests` decodes runs the ON mode (ungoverned levels
        always do)."""
        return not self.governs(num_requests) or self.level(num_requests).on

    def record(self, num_requests: int, emitted: int, seconds: float, plain_seconds: float,
               forward_seconds: float | None = None) -> None:
        if num_requests > 0 and self.governs(num_requests):
            self.level(num_requests).record(num_requests, emitted, seconds, plain_seconds, forward_seconds)

    @property
    def switches(self) -> int:
        return sum(lv.switches for lv in self.levels.values())

    def steps(self, mode: str) -> int:
        return sum(lv.steps[mode] for lv in self.levels.values())

    def summary(self) -> dict:
        """Per load level (requests "lo-hi"): its mode, scores, steps per mode, switches,
        the modes under their names (`modes`)."""
        name = self.modes
        out = {}
        for b, lv in sorted(self.levels.items()):
            st = lv.summary()
            st["mode"] = name[st["mode"]]
            st["score"] = {name[m]: v for m, v in st["score"].items()}
            st["steps"] = {name[m]: v for m, v in st["steps"].items()}
            out[f"{2**b}-{2**(b + 1) - 1}"] = st
        return out


class LoadLevel:
    """The alternation of one load level (see the module docstring)."""

    #: a speculation trial below this share of plain decoding's efficiency over the
    #: trial's first half ends there
    EARLY_EXIT = 0.85
    #: the same at a level that starts with plain decoding (verification is dear there,
    #: so speculation is expected to lose): its trial keeps its second half only while
    #: speculation is level with plain decoding
    EARLY_EXIT_OFF_START = 1.0
    #: speculation is chosen only when it scores at least this many times plain
    #: decoding: when the two are level, plain decoding (the output's own pace, none of
    #: speculation's variance) is the safe side
    ON_MARGIN = 1.02
    #: a level of `plain_fallback`'s (8 requests and up by default) starts plain and runs
    #: its first gap this many times `min_gap`, as if plain decoding had won that many
    #: trials already: the first trial is the dearest (engine alone at 16 and 32
    #: requests, bursts of 200-400 steps lost 1-3 % to it), and once settled a level
    #: tries speculation every `max_gap` steps either way. A level below that which
    #: starts plain because the step-time curve says verification is dear runs the
    #: shortest first gap: that prior is a ratio of two profiled times near its threshold
    #: (T(8) / T(4) read 1.01-1.17 in nine profiles of one AMX Xeon and 1.21 in a tenth,
    #: where speculation pays 1.14x at four requests), and a first trial 4 x `min_gap`
    #: steps late left four requests at 1.06x there (1.12x with the shortest first gap:
    #: docs/journal.md); where the prior is right (an AVX2-only CPU,
    #: 1.3-1.4), the trial ends halfway (EARLY_EXIT_OFF_START) after `trial`
    #: speculation steps
    OFF_START_GAPS = 4
    #: a mode's score is its trials' output over their time, each earlier trial weighed
    #: by this much less than the next: one lucky trial of bursty speculation (lookup
    #: hits come in runs) does not outvote the trials before it
    HISTORY = 0.5
    #: a trial's blocks, the two modes alternating in the order A B B A (a trend in the
    #: machine's speed or the requests' lengths falls on both alike); each block is a
    #: quarter of `trial` steps, so that each mode runs 2 x `trial` steps per trial
    TRIAL_BLOCKS = 16
    #: a speculation gap ends early when its output bound (`_bound_gap`) falls below
    #: this share of plain decoding's over a window
    GAP_BOUND = 0.98
    #: besides its score, speculation is chosen only when its trials emitted at least
    #: ON_MARGIN times the other mode's tokens per request and step (plain decoding's
    #: one; drafter_or_lookup's lookup alone, whatever it emitted): a step that
    #: verifies more tokens never costs less than a plain one, and a step that drafts
    #: rarely less than one that only looks up, so the ratio of yields bounds the gain

    def __init__(self, trial: int, min_gap: int, max_gap: int, warmup: int, start: str = ON,
                 off_start_gaps: int = OFF_START_GAPS) -> None:
        """`off_start_gaps`: a plain start's first gap in units of `min_gap`."""
        self.trial = trial
        self.block = max(1, trial // 4)  # steps per trial block
        self.min_gap = min_gap
        self.max_gap = max_gap
        self.warmup = warmup  # a trial's first steps, not scored (the switched-to mode settling)
        # the starting mode runs a whole gap first (speculation: the drafter's first
        # steps, calibration and scheduler history, are not what it does once settled)
        self.mode = self.start = start
        self.gap = min_gap if start == ON else min(max(1, off_start_gaps) * min_gap, max_gap)
        self._left = self.gap  # steps left in the current gap or trial block
        self._trial = False  # a trial is running
        self._gap_mode = start  # the mode of the gap the current trial follows
        self._blocks = 0  # blocks of the current trial done
        self._skip = 0  # the trial's warm-up steps left
        #: the current trial's scored output (in plain-step units), seconds, tokens
        #: emitted and request-steps, per mode
        self._run = {ON: [0.0] * 4, OFF: [0.0] * 4}
        #: each mode's efficiency over the recent trials (None: not measured yet)
        self.score: dict[str, float | None] = {ON: None, OFF: None}
        self._sums = {ON: [0.0] * 4, OFF: [0.0] * 4}  # the same per mode, decayed over the trials
        #: steps run in each mode, and the number of switches
        self.steps = {ON: 0, OFF: 0}
        self.switches = 0
        self._last_best: str | None = None if start == ON else OFF  # plain's prior win
        #: the current speculation gap's window: output (plain-step units), the table's
        #: forward seconds, steps (`_bound_gap`); and the gaps ended by it
        self._bound = [0.0, 0.0, 0]
        self.gap_exits = 0

    @property
    def on(self) -> bool:
        return self.mode == ON

    @property
    def trialing(self) -> bool:
        """A trial is running (the modes alternating in blocks)."""
        return self._trial

    def record(self, num_requests: int, emitted: int, seconds: float, plain_seconds: float,
               forward_seconds: float | None = None) -> None:
        """One pure decode step of the current mode: `emitted` tokens for `num_requests`
        requests in `seconds`; `plain_seconds` the table's time of a plain step for them,
        `forward_seconds` the table's time of the target forward the step ran (its
        verified tokens; None: not known)."""
        if num_requests <= 0 or seconds <= 0 or plain_seconds <= 0:
            return
        self.steps[self.mode] += 1
        self._left -= 1
        if not self._trial:
            if self.mode == ON and forward_seconds is not None and forward_seconds > 0:
                self._bound_gap(emitted * plain_seconds / num_requests, forward_seconds)
            if self._left <= 0:
                self._start_trial()
            return
        if self._skip > 0:
            self._skip -= 1
        else:  # tokens in units of a plain step's output, and the time they took
            run = self._run[self.mode]
            run[0] += emitted * plain_seconds / num_requests
            run[1] += seconds
            run[2] += emitted
            run[3] += num_requests
        if self._left > 0:
            return
        self._blocks += 1
        if self._blocks >= self.TRIAL_BLOCKS or self._losing_trial():
            self._end_trial()
            return
        other = OFF if self._gap_mode == ON else ON
        self._switch(other if self._blocks % 4 in (0, 3) else self._gap_mode)
        self._left = self.block

    def _bound_gap(self, output: float, forward_seconds: float) -> None:
        """A speculation gap is not scored (its time cannot be compared with plain
        decoding's, taken at another moment), but its output over the table's time of
        the forwards it ran bounds its efficiency from above and does not drift (both
        come from the same profile): drafting and bookkeeping only add to the time. A
        gap whose bound falls below `GAP_BOUND` over a window of 2 x `trial` steps ends
        there (lookup hits can come in bursts that verify many tokens per request for
        few more accepted, and a trial need not have seen one), and plain decoding runs
        the shortest gap."""
        self._bound[0] += output
        self._bound[1] += forward_seconds
        self._bound[2] += 1
        if self._bound[2] < 2 * self.trial:
            return
        losing = self._bound[0] < self.GAP_BOUND * self._bound[1]
        self._bound = [0.0, 0.0, 0]
        if losing:
            self.gap_exits += 1
            self._last_best = OFF
            self.gap = self.min_gap
            self._switch(OFF)
            self._left = self.gap

    def _start_trial(self) -> None:
        """A gap ended: the trial starts with the other mode, after its warm-up."""
        self._trial = True
        self._gap_mode = self.mode
        self._blocks = 0
        self._skip = self.warmup
        self._switch(OFF if self.mode == ON else ON)
        self._left = self.block + self.warmup

    def _efficiency(self, mode: str) -> float | None:
        run = self._run[mode]
        return run[0] / run[1] if run[1] > 0 else None

    def _losing_trial(self) -> bool:
        """Halfway through (each mode has run as many blocks), a trial in which
        speculation runs below EARLY_EXIT of plain decoding's efficiency
        (EARLY_EXIT_OFF_START at a level that started plain) ends there: its second
        half is for the bursts that make speculation pay, and a trial this far behind
        costs more than it tells."""
        if self._blocks != self.TRIAL_BLOCKS // 2:
            return False
        spec, plain = self._efficiency(ON), self._efficiency(OFF)
        exit_below = self.EARLY_EXIT if self.start == ON else self.EARLY_EXIT_OFF_START
        return spec is not None and plain is not None and spec < exit_below * plain

    @property
    def on_yield(self) -> float | None:
        """The ON mode's tokens per request and step over its recent trials (None: not
        measured yet)."""
        return self._yield(ON)

    def _yield(self, mode: str) -> float | None:
        s = self._sums[mode]
        return s[2] / s[3] if s[3] > 0 else None

    def _end_trial(self) -> None:
        """Both modes' trial runs into their scores (decayed alike: the scores stay
        paired), then the winner's gap (longer if it won the last trial too)."""
        for mode, run in self._run.items():
            if run[1] > 0:
                sums = self._sums[mode]
                sums[:] = [self.HISTORY * a + b for a, b in zip(sums, run)]
                self.score[mode] = sums[0] / sums[1]
            self._run[mode] = [0.0] * 4
        spec, plain = self.score[ON], self.score[OFF]
        ahead = spec is not None and plain is not None and spec >= self.ON_MARGIN * plain
        best = ON if ahead and self.on_yield >= self.ON_MARGIN * self._yield(OFF) else OFF
        self.gap = min(2 * self.gap, self.max_gap) if best == self._last_best else self.min_gap
        self._last_best = best
        self._trial = False
        self._switch(best)
        self._left = self.gap

    def _switch(self, mode: str) -> None:
        if mode != self.mode:
            self.switches += 1
        self.mode = mode
        self._bound = [0.0, 0.0, 0]

    def summary(self) -> dict:
        return {"mode": self.mode, "score": dict(self.score), "on_yield": self.on_yield,
                "steps": dict(self.steps), "switches": self.switches, "gap": self.gap, "gap_exits": self.gap_exits}

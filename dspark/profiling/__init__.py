"""Profiling, in one place: what a forward costs on this machine.

- `measure`: timing the target's forward by token count, and probing the load other
  processes put on the CPU (threads that fit beside it);
- `tables`: the cached step-time table (`profile_target`: spot-checked when reused,
  not cached when noisy), the drafter's cost by request count, `load_or_profile`
  for the engine;
- `watch`: `StepWatch`, measured steps against the table while serving (fewer
  threads under load, a rescaled table on drift).

The table itself (`StepTimeTable`) is the scheduler's input and lives, pure, in
`dspark.schedule.step_time`; plots are drawn by the CLI (`dspark profile`).
"""

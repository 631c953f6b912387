"""The evaluation: councils against single agents on problems with hidden tests (arms A-E).

One package, one module per part; importing it imports none of them, so its pure part loads
without Dagster, Ray or pandas:
- `arms`: pure (no I/O, no framework): the arms, the problems' test programs, the selector,
  metrics and statistics;
- `suites`, `fleet_suite`, `repo_suite`, `repo_problems`: the benchmark suites and their problems;
- `settings`: `EvaluationSettings`, each field declared once (default, bounds, description);
  `config`: the asset's `EvaluationConfig`, derived from those fields, and which problems;
- `runner`: the arms of each problem as Ray tasks, candidates judged in the sandbox;
- `report`: the report, the plot and the drop check.
The `evaluation` asset (assets/evaluation.py) and the nightly schedule (schedules/evaluation.py)
are its Dagster definitions, kept beside every other asset and schedule, and hold no logic.
"""

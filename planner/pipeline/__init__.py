"""Pipeline schedules as data (:mod:`planner.pipeline.schedules`), their closed forms
(:mod:`planner.pipeline.closed_form`) and the event simulator
(:mod:`planner.pipeline.simulate`). Knows no links, Jobs or Layouts."""

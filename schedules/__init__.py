"""Per-target schedule knobs (package data tvm_ops.schedules): one YAML file per operator."""

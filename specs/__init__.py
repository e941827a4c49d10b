"""Operator contracts (package data tvm_ops.specs): one YAML file per operator."""

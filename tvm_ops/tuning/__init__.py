"""Schedule tuning: the knob search (tune) and the comparison with TVM's meta_schedule."""

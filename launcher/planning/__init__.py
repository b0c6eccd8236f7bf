"""From hosts and a model to a plan: model sources, calibration figures, the cluster plan."""

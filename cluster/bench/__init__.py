"""The rank's timed runs: benchmarks and calibration."""

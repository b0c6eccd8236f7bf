"""`mlx-cluster bench`: benchmark runs, their report and plot, the machine description."""

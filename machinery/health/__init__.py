"""A run's health: its meters, its incidents (detected, decided, acted on), and faults planted for teaching.

Each file's job:

    monitor.py             meters: activation memory, state bytes, throughput; the metrics plot
    incidents.py           detected, decided, acted on: HealthMonitor, the runbook, Recovery and its LR factor
    faults.py              faults injected on demand: a NaN weight, a garbage batch, a dead or hung rank
"""

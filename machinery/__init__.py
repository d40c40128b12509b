"""The machinery around the lesson: everything a real run needs that the loop, the model, the token stream and
the parallelisms (model.py, train.py, data.py, parallel/) do not teach. The lesson reaches it through the Run that
run_setup.py builds; nothing here is needed to read the lesson.

    config.py        the configuration dataclasses, presets and the `--name value` command line
    run_setup.py     everything before the first step, built into one Run: processes, data, model, optimizer
    run_folder.py    one run per --out_dir: what makes two runs the same, the JSON-lines logs
    checkpoint.py    the single-device form of any layout's state, and checkpoint folders on disk
    evaluation.py    val loss over the same rows every time, HellaSwag, the final check
    monitor.py       activation memory, throughput, the health detectors, the metrics plot
    runbook.py       the incident runbook's rungs and the choice among them
    faults.py        faults injected on demand: a NaN weight, a garbage batch, a dead or hung rank
    cluster.py       a run on a cluster's terms: stop signals, heartbeats, the run folder's lock
    mixture.py       --mix: several sources, their weights by step
    transfer.py      weights in and out: --init_from, --export_hf, safetensors, named bases
    sample.py        text from a trained model
    tracking.py      --log_to tensorboard,wandb
    cost.py          the cost account and the layout planner (python -m machinery.cost)
    curves.py        is this curve normal? A run against a band of its recipe over seeds (python -m machinery.curves)
    local_ranks.py   ranks on one machine without torchrun, for tests and notebooks
    files.py         files a crash never leaves half-written, checked downloads
"""

"""The job a run is: its configuration, and the processes it runs in on a cluster.

Each file's job:

    config.py              the configuration dataclasses, presets, config files and the `--name value` command line
    arms.py                the counterfactual arms the notebooks measure the defenses against (Post-LN, no norm, ...)
    cluster.py             a cluster's terms: stop signals, heartbeats, the folder's lock, one voice, ranks as one
    torch_engines.py       torch's own DDP and FSDP2 (--dp_mode ddp|fsdp) behind the lesson's RankModel
    local_ranks.py         ranks on one machine without torchrun, for tests, benchmarks and notebooks
    files.py               files a crash never leaves half-written, sha256, checked downloads
"""

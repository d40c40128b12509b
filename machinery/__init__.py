"""The machinery around the lesson: everything a real run needs that the loop, the model, the token stream and
the parallelisms (model.py, train.py, data.py, parallel/) do not teach. The lesson reaches it through the Run that
run_setup.py builds; nothing here is needed to read the lesson. Each file's job, by concern:

  configuring and setting up a run
    config.py              the configuration dataclasses, presets, config files and the `--name value` command line
    arms.py                the counterfactual arms the notebooks measure the defenses against (Post-LN, no norm, ...)
    run_setup.py           everything before the first step, built into one Run of a few components (Job, Learner)
    init_from.py           the model a run starts from: a fresh init, or --init_from's weights fitted to the run
    torch_engines.py       torch's own DDP and FSDP2 (--dp_mode ddp|fsdp) behind the lesson's RankModel
    modes.py               what replaces training: --sample, --eval_only, --export_hf
  a run's folder, checkpoints and resume
    run_folder.py          one run per --out_dir (RunFolder): what makes two runs the same, the JSON-lines logs
    run_data.py            the run's data (RunData): token files prepared, the streams, validation
    checkpoint.py          the single-device form of any layout's state, and checkpoint folders on disk
    checkpointer.py        the Checkpointer: what a checkpoint holds, restore, load, save
    files.py               files a crash never leaves half-written, sha256, checked downloads
  watching a run, and its incidents
    monitor.py             meters: activation memory, state bytes, throughput; the metrics plot
    incidents.py           detected, decided, acted on: HealthMonitor, the runbook, Recovery and its LR factor
    faults.py              faults injected on demand: a NaN weight, a garbage batch, a dead or hung rank
    cluster.py             a cluster's terms: stop signals, heartbeats, the folder's lock, ranks that stop as one
    reporting.py           what a run says: the cost account, each logged step, the end of a run
    tracking.py            --log_to tensorboard,wandb
    evaluation.py          val loss over the same rows every time, HellaSwag, the final check
  data
    corpus.py              a corpus into token files, once, with its tokenizer (python -m machinery.corpus)
    mixture.py             --mix: several sources, their weights by step
  weights in and out
    transfer.py            where a run's first weights come from (a run, a Hugging Face folder, a named base), exports
    hf_layouts.py          Hugging Face's GPT-2 and Llama parameter names and config.json, against ours
    safetensors_format.py  the safetensors format read and written, and sharded folders
    sample.py              text from a trained model: generate, a token at a time with a KV cache
  what a run costs
    closed_forms.py        parameters, FLOPs, bytes sent per step, state and activations, in closed form
    planner.py             a layout's step time and memory, the layouts ranked, checkpoint economics
    cost.py                the named shapes, a run's account, the command line (python -m machinery.cost)
  reading curves
    bands.py               a recipe over seeds: its band, edge and p-value; a run's files read back by step
    curves.py              is this curve normal? A run against its band (python -m machinery.curves)
    compare.py             runs compared checkpoint by checkpoint on one fixed evaluation (python -m machinery.compare)
  for tests, benchmarks and notebooks
    local_ranks.py         ranks on one machine without torchrun
"""

"""The Run and its components: everything a run holds from set-up to its end, each part owning its state.

Each file's job:

    run_setup.py           everything before the first step, built into one Run of a few components (Job, Learner)
    run_folder.py          one run per --out_dir (RunFolder): what makes two runs the same, the JSON-lines logs
    run_data.py            the run's data (RunData): token files prepared, the streams, validation
    init_from.py           the model a run starts from: a fresh init, or --init_from's weights fitted to the run
    checkpoint.py          the single-device form of any layout's state, and checkpoint folders on disk
    checkpointer.py        the Checkpointer: what a checkpoint holds, restore, load, save
    reporting.py           the Reporter: the cost account, each logged step, the end of a run
    tracking.py            --log_to tensorboard,wandb
    evaluation.py          val loss over the same rows every time, HellaSwag, the final check
    sample.py              text from a trained model: generate, a token at a time with a KV cache
    modes.py               what replaces training: --sample, --eval_only, --export_hf
"""

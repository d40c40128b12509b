"""Weights in and out: other runs, Hugging Face folders and named bases in, transformers folders out.

Each file's job:

    transfer.py            where a run's first weights come from (a run, a Hugging Face folder, a named base), exports
    hf_layouts.py          Hugging Face's GPT-2 and Llama parameter names and config.json, against ours
    safetensors_format.py  the safetensors format read and written, and sharded folders
"""

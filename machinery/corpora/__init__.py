"""A run's data: a corpus into token files, and several sources mixed by step.

Each file's job:

    corpus.py              a corpus into token files, once, with its tokenizer (python -m machinery.corpus)
    mixture.py             --mix: several sources, their weights by step
"""

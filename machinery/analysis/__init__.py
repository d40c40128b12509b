"""Reading runs after the fact: a curve against its recipe's band over seeds, and runs compared.

Each file's job:

    bands.py               a recipe over seeds: its band, edge and p-value; a run's files read back by step
    curves.py              is this curve normal? A run against its band (python -m machinery.curves)
    compare.py             runs compared checkpoint by checkpoint on one fixed evaluation (python -m machinery.compare)
"""

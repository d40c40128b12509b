"""What a run costs before it runs: closed forms, a layout's step time and memory, the account.

Each file's job:

    closed_forms.py        parameters, FLOPs, bytes sent per step, state and activations, in closed form
    planner.py             a layout's step time and memory, the layouts ranked, checkpoint economics
    cost.py                the named shapes, a run's account, the command line (python -m machinery.cost)
"""

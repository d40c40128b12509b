"""The machinery around the lesson: everything a real run needs that the loop, the model, the token stream and
the parallelisms (model.py, train.py, data.py, parallel/) do not teach. The lesson reaches it through the Run that
components/run_setup.py builds; nothing here is needed to read the lesson. Each folder has one job, and its
__init__.py gives each of its files' jobs in a line:

    components/            the Run and its components: set-up, folder, data, checkpoints, reporting, evaluation
    job/                   the configuration, and the processes a run runs in on a cluster
    corpora/               a corpus into token files, and several sources mixed by step
    health/                meters, incidents (detected, decided, acted on), faults planted for teaching
    analysis/              a curve against its recipe's band over seeds, and runs compared
    planning/              what a run costs: closed forms, a layout's time and memory, the account
    interchange/           weights in and out: runs, Hugging Face folders, named bases, exports

The commands the docs give run from here:

    corpus.py              python -m machinery.corpus: corpora/corpus.py's command line
    cost.py                python -m machinery.cost: planning/cost.py's command line
    curves.py              python -m machinery.curves: analysis/curves.py's command line
    compare.py             python -m machinery.compare: analysis/compare.py's command line
"""

"""python -m machinery.compare: machinery/analysis/compare.py's command line, where the docs give it."""

from machinery.analysis.compare import main

if __name__ == "__main__":
    main()

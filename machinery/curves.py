"""python -m machinery.curves: machinery/analysis/curves.py's command line, where the docs give it."""

from machinery.analysis.curves import main

if __name__ == "__main__":
    main()

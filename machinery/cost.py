"""python -m machinery.cost: machinery/planning/cost.py's command line, where the docs give it."""

from machinery.planning.cost import main

if __name__ == "__main__":
    main()

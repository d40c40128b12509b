"""python -m machinery.corpus: machinery/corpora/corpus.py's command line, where the docs give it."""

from machinery.corpora.corpus import main

if __name__ == "__main__":
    main()

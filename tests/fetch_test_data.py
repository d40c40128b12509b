"""Fetch the data a few tests read, once: Tiny Shakespeare and GPT-2's BPE files (tiktoken's cache).

    python tests/fetch_test_data.py              # into data/test-data, where the tests look (conftest.py)
    python tests/fetch_test_data.py FOLDER       # elsewhere; then MINIPRETRAIN_TEST_DATA=FOLDER python -m pytest

Needs the network (about 3 MB); the tests themselves never download. Tiny Shakespeare is checked against the
sha256 the project knows it by (data.DOWNLOADS).
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machinery.corpora.corpus import DOWNLOADS  # noqa: E402
from machinery.job.files import download  # noqa: E402


def main():
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "data" / "test-data"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"Tiny Shakespeare: {download('shakespeare', folder, DOWNLOADS['shakespeare'])}")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder / "tiktoken_cache")  # tiktoken reads it when it loads the files
    import tiktoken

    tiktoken.get_encoding("gpt2")
    print(f"GPT-2's BPE files: {folder / 'tiktoken_cache'}")
    if folder != ROOT / "data" / "test-data":
        print(f"now run the tests with MINIPRETRAIN_TEST_DATA={folder}")


if __name__ == "__main__":
    main()

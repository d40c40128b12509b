"""Write a student copy of the project with exercise bodies replaced by a stub.

    python exercises/make.py STUDENT_DIR                       # every exercise
    python exercises/make.py STUDENT_DIR --only lr_at,init      # some

Every file the project tracks is copied; in the chosen exercises, the lines between
`# exercise NAME: begin` and `# exercise NAME: end` become one line,
raise NotImplementedError("exercise NAME: ..."), so the signature and docstring stay.
Then: python exercises/grade.py --root STUDENT_DIR
"""

import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from catalog import BY_NAME, EXERCISES, stub  # noqa: E402

from errors import UserError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def project_files(root, untracked=False):
    """The files git tracks (the project, not its runs, data or caches); with untracked, also the files
    git would track if added (a teacher's new tests and mutants), never the ignored ones."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", *(["--others", "--exclude-standard"] if untracked else [])],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        raise SystemExit(f"error: {root} is not a git checkout; make.py copies the files git tracks there")
    return [f for f in listed.stdout.splitlines() if os.path.isfile(os.path.join(root, f))]


def make(out_dir, names, root=ROOT, untracked=False, quiet=False):
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SystemExit(f"error: {out_dir} exists and is not empty: choose a new folder (nothing was written)")
    for f in project_files(root, untracked):
        os.makedirs(os.path.dirname(os.path.join(out_dir, f)) or out_dir, exist_ok=True)
        shutil.copy2(os.path.join(root, f), os.path.join(out_dir, f))
    for name in names:
        path = os.path.join(out_dir, BY_NAME[name].file)
        with open(path) as f:
            source = f.read()
        try:
            stubbed = stub(source, BY_NAME[name])
        except UserError as e:
            raise SystemExit(f"error: {e}") from None
        with open(path, "w") as f:
            f.write(stubbed)
    if not quiet:
        print(f"wrote {out_dir}: the project with {len(names)} exercise(s) to write: {', '.join(names)}")
        print(f"grade them with: python exercises/grade.py --root {out_dir}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--only", help=f"comma-separated names, from: {', '.join(BY_NAME)}")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else [e.name for e in EXERCISES]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"error: --only {','.join(unknown)}: no such exercise; choose from {', '.join(BY_NAME)}")
    make(args.out_dir, names)


if __name__ == "__main__":
    main()

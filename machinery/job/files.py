"""Files that a crash never leaves half-written: synced and atomic writes, a file's sha256, checked downloads.

Atomic: the bytes go to PATH.tmp, are flushed and fsynced, and one rename puts
them at PATH, so a reader finds the old file or the whole new one, never part
of it. A rename is durable once its folder is fsynced too (fsync_dir), which is
what checkpoint.py does after renaming a checkpoint's folder into place.
Downloads are checked against a sha256 before they take their name, and take
file:// URLs too, for a machine without network.
"""

import hashlib
import json
import os
import urllib.request

from errors import UserError


def write_synced(path, write, mode="w"):
    """Open path, write(f), and return only once the bytes are on disk (flush, then fsync)."""
    with open(path, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path, write, mode="w"):
    """write(f) into path.tmp, synced, then rename it over path."""
    tmp = path + ".tmp"
    write_synced(tmp, write, mode)
    os.replace(tmp, path)


def write_json_atomic(path, obj):
    write_atomic(path, lambda f: json.dump(obj, f, indent=1))


def fsync_dir(path):
    """Make a rename in `path` durable. Where a folder cannot be opened as a file (Windows:
    PermissionError), there is nothing to fsync: NTFS journals the rename itself."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_if_exists(path):
    if os.path.exists(path):
        os.remove(path)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(name, dest_dir, spec, url=None):
    """Fetch `name` into dest_dir once, verify its sha256, return its path. spec: dict(url, sha256,
    filename, offline_flags), the flags that hand over a local copy instead (named in the error)."""
    os.makedirs(dest_dir, exist_ok=True)
    path = os.path.join(dest_dir, spec["filename"])
    if os.path.exists(path) and file_sha256(path) == spec["sha256"]:
        return path
    url = url or spec["url"]
    print(f"downloading {name} from {url}", flush=True)
    tmp = path + ".tmp"
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
            copy_with_progress(response, f, int(response.headers.get("Content-Length") or 0), name)
    except OSError as e:
        remove_if_exists(tmp)
        path_flag, url_flag = spec["offline_flags"]
        raise UserError(
            f"could not download {name} from {url} ({e}). Without network, pass a local copy "
            f"as {path_flag} path/to/{spec['filename']} or as {url_flag} file:///path/to/{spec['filename']}"
        ) from None
    got = file_sha256(tmp)
    if got != spec["sha256"]:
        remove_if_exists(tmp)
        raise UserError(f"{url} has sha256 {got}, expected {spec['sha256']}: not the {name} file")
    os.replace(tmp, path)
    return path


def copy_with_progress(source, dest, total_bytes, name, block=1 << 20):
    """Copy a stream, printing a line at each tenth of total_bytes (each 100 MB where the size is unknown):
    GPT-2 XL's weights are 6 GB, minutes of silence otherwise."""
    done, next_report = 0, 0
    step = max(total_bytes // 10, 1 << 20) if total_bytes else 100 << 20  # at least a MB between lines
    for chunk in iter(lambda: source.read(block), b""):
        dest.write(chunk)
        done += len(chunk)
        if done >= next_report + step:
            next_report = done - done % step
            of_total = f" of {total_bytes / 1e6:,.0f} MB" if total_bytes else " MB"
            print(f"  {name}: {done / 1e6:,.0f}{of_total}", flush=True)

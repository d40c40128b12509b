"""safetensors, read and written by code of our own: the format is an 8-byte little-endian header length N, N bytes of
JSON header ({name: {dtype, shape, data_offsets}}, plus an optional "__metadata__" of strings), then the tensors' raw
little-endian bytes at those offsets; a model too large for one file is several, named by an index
(model.safetensors.index.json). Writing it ourselves keeps the run-time dependencies at torch, numpy, tiktoken and
matplotlib, and shows that a weights file is nothing more. (The tests check it against the safetensors package.)
"""

import json
import math
import os
import struct

import torch

from errors import UserError
from machinery.job import files

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
SAFETENSORS_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


def read_safetensors(path):
    """{name: tensor} of a .safetensors file, on the CPU in the file's dtypes (the bytes are read as
    little-endian, as on every machine torch runs on)."""

    def malformed(problem):
        return UserError(f"{path} is not a valid safetensors file: {problem}")

    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        if file_size < 8:
            raise malformed(f"{file_size} bytes, shorter than the 8-byte header length")
        (header_size,) = struct.unpack("<Q", f.read(8))
        if header_size > file_size - 8:
            raise malformed(f"its header length {header_size} runs past the end of the file ({file_size} bytes)")
        try:
            header = json.loads(f.read(header_size))
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise malformed(f"its header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise malformed("its header is not a JSON object")
        header.pop("__metadata__", None)
        data_start, data_size = 8 + header_size, file_size - 8 - header_size
        tensors = {}
        for name, entry in header.items():
            dtype, shape, begin, end = _tensor_entry(name, entry, data_size, malformed)
            f.seek(data_start + begin)
            buffer = bytearray(end - begin)
            f.readinto(buffer)
            # frombuffer shares the bytearray's memory: no second copy of the weights
            tensors[name] = (
                torch.frombuffer(buffer, dtype=dtype).reshape(shape) if buffer else torch.empty(shape, dtype=dtype)
            )
    return tensors


def _tensor_entry(name, entry, data_size, malformed):
    """(dtype, shape, begin, end) of one header entry, checked: a known dtype, and offsets that lie in
    the data and span exactly the bytes its shape needs."""
    if not isinstance(entry, dict):
        raise malformed(f"tensor {name}'s entry {entry!r} is not a JSON object")
    if entry.get("dtype") not in SAFETENSORS_DTYPES:
        raise malformed(
            f"tensor {name} has dtype {entry.get('dtype')!r}; this reader knows {', '.join(SAFETENSORS_DTYPES)}"
        )
    try:
        shape = [int(n) for n in entry["shape"]]
        begin, end = (int(n) for n in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise malformed(f"tensor {name}'s entry {entry} lacks a shape or a [begin, end] data_offsets") from None
    dtype = SAFETENSORS_DTYPES[entry["dtype"]]
    needed = math.prod(shape) * dtype.itemsize
    if not 0 <= begin <= end <= data_size or end - begin != needed:
        raise malformed(
            f"tensor {name} ({entry['dtype']} {shape}, {needed} bytes) has data_offsets [{begin}, {end}] "
            f"in a data section of {data_size} bytes"
        )
    return dtype, shape, begin, end


def write_safetensors(path, tensors, metadata=None):
    """Write {name: tensor} to path as safetensors (atomically: a reader finds the old file or the whole new
    one). metadata: {str: str}, the header's "__metadata__" (transformers looks for {"format": "pt"})."""
    files.write_atomic(path, safetensors_writer(tensors, metadata), mode="wb")


def safetensors_writer(tensors, metadata=None):
    """write(f): writes {name: tensor} as a safetensors file into f, opened "wb" (write_safetensors)."""
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    header, offset = ({"__metadata__": dict(metadata)} if metadata else {}), 0
    for name, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_NAMES:
            raise ValueError(
                f"tensor {name} has dtype {tensor.dtype}; safetensors holds {', '.join(SAFETENSORS_DTYPES)}"
            )
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": SAFETENSORS_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # spaces up to a multiple of 8, as the reference pads it

    def write(f):
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for tensor in tensors.values():
            f.write(tensor.reshape(-1).view(torch.uint8).numpy())  # its raw bytes, in the machine's (little) endianness

    return write


# A large model's weights in several files: model-00001-of-0000N.safetensors, and model.safetensors.index.json
# whose "weight_map" names each tensor's file (Hugging Face's layout)
SHARD_INDEX = "model.safetensors.index.json"


def read_safetensors_folder(folder):
    """{name: tensor} of a folder's model.safetensors, or of every shard its model.safetensors.index.json names."""
    index = os.path.join(folder, SHARD_INDEX)
    if not os.path.isfile(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]  # {tensor name: its shard's file name}
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{index} is not a shard index (a JSON object with a weight_map): {e}") from None
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(os.path.join(folder, shard)))
    if missing := sorted(set(weight_map) - set(tensors)):
        raise UserError(f"{index} names tensors its shards do not hold: {', '.join(missing[:5])}")
    return tensors


def shard_writers(tensors, max_bytes, metadata=None):
    """{file name: write(f)} of tensors in as few files as hold at most max_bytes each (a larger tensor alone):
    model.safetensors when one file does, else the numbered shards and their index."""
    shards, size = [{}], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name], size = tensor, size + nbytes
    if len(shards) == 1:
        return {"model.safetensors": safetensors_writer(tensors, metadata)}
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": {t: n for n, s in zip(names, shards) for t in s}}
    writers = {name: safetensors_writer(shard, metadata) for name, shard in zip(names, shards)}
    return writers | {SHARD_INDEX: lambda f: f.write(json.dumps(index, indent=2).encode())}

"""Request bodies the load generator sends: random valid inputs from a model's metadata (sentences for a
text deployment's BYTES input), as JSON tensors or with the binary tensor extension."""

from __future__ import annotations

import math
import random
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import orjson

from latlab.loadtest.plan import PayloadOptions
from latlab.loadtest.sentences import sentence, token_length
from latlab.loadtest.sizes import max_length

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_HEADERS = {"Content-Type": "application/json"}
MIN_SENTENCE_TOKENS = 3
"""[CLS], a word and [SEP]: the shortest sentence (sentences.py)."""
MAX_BODIES = 32
BODY_BUDGET_BYTES = 16 * 2**20
"""Bodies kept per user: a 3x224x224 image is 0.6 MB binary, ~3 MB as JSON text; a few are enough
to vary the inputs without holding hundreds of MB per user."""

_NUMPY_TYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@dataclass(frozen=True)
class Body:
    data: bytes
    headers: dict[str, str]


def request_bodies(metadata: dict, seed: int, options: PayloadOptions = PayloadOptions()) -> list[Body]:
    """The bodies a load-generator user sends: the sample file's rows when options.inputs names one, else
    random valid inputs."""
    if options.inputs:
        return sample_bodies(metadata, load_samples(options.inputs), options.binary)
    return random_bodies(metadata, seed, options)


def random_bodies(metadata: dict, seed: int, options: PayloadOptions = PayloadOptions()) -> list[Body]:
    """Valid infer bodies of batch 1 with random data, from the model's metadata; as many as fit the budget."""
    if options.text:
        require_text(metadata)
    rng = np.random.default_rng(seed)
    sizes = options.size_spec
    if sizes.varies and sizes.kind != "trace":  # a trace's sizes come with its rows (users.py); these stand for it
        cap = max_length(metadata)
        draws = sizes.draws(seed)
        return [sized_body(metadata, rng, options, min(next(draws), cap or math.inf)) for _ in range(MAX_BODIES)]
    bodies = [_body(metadata, rng, options)]
    count = max(1, min(MAX_BODIES, BODY_BUDGET_BYTES // max(len(bodies[0].data), 1)))
    bodies += [_body(metadata, rng, options) for _ in range(count - 1)]
    return bodies


def sized_body(metadata: dict, rng: np.random.Generator, options: PayloadOptions, size: int) -> Body:
    """A valid infer body of batch 1 whose dynamic axes after the batch are `size` long (a text input: sentences of
    `size` tokens, at least the 3 a sentence takes)."""
    if any(spec["datatype"] == "BYTES" for spec in metadata["inputs"]):
        size = max(size, MIN_SENTENCE_TOKENS)
    return _body(metadata, rng, replace(options, seq_len=size, seq_len_max=0, sizes=""))


def sizeable(metadata: dict) -> bool:
    """Whether a request's size can vary: an input with a dynamic axis after the batch, or text."""
    return any(spec["datatype"] == "BYTES" or any(d < 0 for d in spec["shape"][1:]) for spec in metadata["inputs"])


def require_text(metadata: dict) -> None:
    """ValueError naming the model unless it takes text (a BYTES input: a text deployment's sentences)."""
    if not any(spec["datatype"] == "BYTES" for spec in metadata["inputs"]):
        raise ValueError(
            f"--text: model '{metadata.get('name')}' takes no text (BYTES) input; its inputs are "
            f"{[spec['name'] for spec in metadata['inputs']]} (serve it with a [deployments.tokenizer])"
        )


def _body(metadata: dict, rng: np.random.Generator, options: PayloadOptions) -> Body:
    tensors = []
    for spec in metadata["inputs"]:
        shape = [1] + [d if d > 0 else options.seq_len for d in spec["shape"][1:]]
        if spec["datatype"] == "BYTES":
            tensors.append((spec["name"], "BYTES", shape, random_sentences(rng, shape, options)))
        else:
            tensors.append((spec["name"], spec["datatype"], shape, random_tensor(rng, spec, shape)))
    return encode_body(tensors, options.binary)


def load_samples(path: str | Path) -> dict[str, np.ndarray]:
    """The named arrays of an .npz sample file (`numpy.savez`), each with its rows on the first axis, as many
    rows in every array; ValueError in one line when the file is not that. Pickled objects are refused."""
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("it holds one unnamed array; save named inputs with numpy.savez(path, name=array)")
        with archive:
            samples = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise ValueError(f"sample file {path} does not exist") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(
            f"sample file {path} is not an .npz of named arrays (numpy.savez): {_first_line(exc)}"
        ) from None
    if not samples:
        raise ValueError(f"sample file {path} holds no arrays")
    rows = {name: array.shape[0] if array.ndim else 0 for name, array in samples.items()}
    if min(rows.values()) < 1 or len(set(rows.values())) != 1:
        raise ValueError(
            f"sample file {path}: every array needs the same number of rows (at least 1) on its first "
            f"axis, the batch; got {rows}"
        )
    return samples


def save_samples(path: str | Path, samples: dict[str, np.ndarray]) -> None:
    """Write named arrays as load_samples reads them (what numpy.savez writes, for any input name: savez's own
    keyword arguments would refuse an input called `file`)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in samples.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def check_samples(metadata: dict, samples: dict[str, np.ndarray]) -> None:
    """ValueError naming the first way the samples do not fit the model's inputs: names, datatype, rank or a
    fixed size (-1 in the metadata's shape: any size)."""
    names = [spec["name"] for spec in metadata["inputs"]]
    if sorted(samples) != sorted(names):
        missing, unknown = sorted(set(names) - set(samples)), sorted(set(samples) - set(names))
        raise ValueError(f"the samples must hold the model's inputs {names}: missing {missing}, unknown {unknown}")
    for spec in metadata["inputs"]:
        array, datatype = samples[spec["name"]], spec["datatype"]
        if datatype not in _NUMPY_TYPES:
            raise ValueError(f"input '{spec['name']}' is {datatype}: sample files hold numeric or BOOL tensors")
        if array.dtype != np.dtype(_NUMPY_TYPES[datatype]):
            raise ValueError(f"input '{spec['name']}' is {datatype}, but its samples are {array.dtype}")
        shape = spec["shape"]
        if array.ndim != len(shape) or any(d > 0 and d != n for d, n in zip(shape[1:], array.shape[1:])):
            raise ValueError(
                f"input '{spec['name']}' has shape {shape} (-1: any), but its samples have "
                f"{list(array.shape)} (rows first)"
            )


def sample_bodies(metadata: dict, samples: dict[str, np.ndarray], binary: bool = False) -> list[Body]:
    """One body of batch 1 per sample row, in the file's order, as many as fit the budget."""
    check_samples(metadata, samples)
    rows = next(iter(samples.values())).shape[0]
    bodies = []
    for row in range(min(rows, MAX_BODIES)):
        tensors = [
            (
                spec["name"],
                spec["datatype"],
                [1, *samples[spec["name"]].shape[1:]],
                samples[spec["name"]][row : row + 1],
            )
            for spec in metadata["inputs"]
        ]
        bodies.append(encode_body(tensors, binary))
        if sum(len(b.data) for b in bodies) >= BODY_BUDGET_BYTES:
            break
    return bodies


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def text_body(sentences: list[str], binary: bool = False, name: str = "text") -> Body:
    """An infer body for a text deployment: `sentences` as one BYTES input of shape [n]."""
    array = np.empty(len(sentences), dtype=object)
    array[:] = [s.encode("utf-8") for s in sentences]
    return encode_body([(name, "BYTES", [len(sentences)], array)], binary)


def encode_body(tensors: list[tuple[str, str, list[int], np.ndarray]], binary: bool) -> Body:
    """(name, datatype, shape, array) tensors as a JSON body or with the binary tensor extension
    (BYTES elements: a 4-byte little-endian length, then the bytes)."""
    if not binary:
        doc = {
            "inputs": [
                {"name": n, "shape": s, "datatype": t, "data": _json_strings(a) if t == "BYTES" else a.reshape(-1)}
                for n, t, s, a in tensors
            ]
        }
        return Body(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), JSON_HEADERS)
    raws = [
        _bytes_wire(a)
        if t == "BYTES"
        else np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        for _, t, _, a in tensors
    ]
    header = orjson.dumps(
        {
            "inputs": [
                {"name": n, "shape": s, "datatype": t, "parameters": {"binary_data_size": len(raw)}}
                for (n, t, s, _), raw in zip(tensors, raws)
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    raw = b"".join(raws)
    return Body(header + raw, {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))})


def random_tensor(rng: np.random.Generator, spec: dict, shape: list[int]) -> np.ndarray:
    """Random values a model accepts: floats from N(0, 1); for integer inputs small ids (valid
    token ids for any vocabulary), and ones for attention masks (a mask of random ids is not a mask)."""
    datatype = spec["datatype"]
    if datatype not in _NUMPY_TYPES:
        raise ValueError(f"input '{spec['name']}' has datatype {datatype}, which the load generator cannot fill")
    dtype = np.dtype(_NUMPY_TYPES[datatype])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if "mask" in spec["name"].lower():
        return np.ones(shape, dtype)
    return rng.integers(0, 100, shape).astype(dtype)


def random_sentences(rng: np.random.Generator, shape: list[int], options: PayloadOptions) -> np.ndarray:
    """A BYTES tensor of real-looking UTF-8 sentences, each `seq_len` tokens long (or drawn up to seq_len_max)."""
    words = random.Random(int(rng.integers(2**32)))
    array = np.empty(int(np.prod(shape)), dtype=object)
    array[:] = [
        sentence(words, token_length(words, options.seq_len, options.seq_len_max)).encode("utf-8")
        for _ in range(array.size)
    ]
    return array.reshape(shape)


def _json_strings(array: np.ndarray) -> list[str]:
    return [item.decode("utf-8") for item in array.flat]


def _bytes_wire(array: np.ndarray) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in array.flat)

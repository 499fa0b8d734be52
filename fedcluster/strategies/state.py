"""A strategy's state as data: typed JSON plus named numpy arrays (checkpoints, issue 17).

The state of a strategy is every attribute of the instance (``vars(strategy)``) except
:data:`TRANSIENT` ones: the run config (stored and compared on its own). So an
attribute a strategy gains is in the checkpoint without being declared; one of a type
this module cannot write fails :func:`encode_state` (and the checkpoint test) instead of
being left out.

:class:`Encoder` turns a value into JSON, every numpy array going into a separate
mapping (``{"__type__": "ndarray", "key": "a3"}``, the same key for the same array object,
so shared arrays stay shared). What it writes, and :func:`decode` reads back:

- ``None``, ``bool``, ``int``, ``str``, ``list``: as themselves; a finite ``float`` as
  itself (Python writes the shortest repr that reads back to the same double), nan and
  +-inf as ``{"__type__": "float", "value": "nan"}``;
- a ``dict`` with string keys as a JSON object; any other dict (int keys, a key named
  ``__type__``) as ``{"__type__": "dict", "items": [[key, value], ...]}``, order kept;
- ``tuple``, ``set``, ``frozenset``: ``{"__type__": "tuple", "items": [...]}`` etc.;
- a numpy scalar: ``{"__type__": "scalar", "dtype": "<f8", "value": ...}`` (bool, int
  and up to 64-bit float dtypes; others go to the arrays as a 0-d array);
- a numpy ``Generator``: its ``bit_generator.state`` (bit generators of :data:`BIT_GENERATORS`);
- the dataclasses of :data:`DATACLASSES` (a site, pooled statistics, the scaling
  transform, the divisive start's state): ``{"__type__": "dataclass", "name": "Site", "fields": {...}}``.

Decoding builds only these types: a name that is not in the two registries is refused
(:class:`StateError`); nothing is imported by name, no code of the file runs. Exact types
only (a subclass of ``tuple``, ``int`` or ``ndarray``, or an object-dtype array, is
refused when written): what is read back equals what was written, type for type.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Mapping

import numpy as np

from fedcluster.common.scaling import FeatureTransform
from fedcluster.strategies.divisive import DivisiveStart
from fedcluster.strategies.metrics import PooledStats
from fedcluster.strategies.sites import Site

#: Instance attributes that are not state: the run config (the checkpoint stores it
#: beside the state; a resumed run takes the new, equal one). The round in flight is
#: the Flower adapter's (``flower_adapter.RoundInFlight``), not the run's.
TRANSIENT = frozenset({"config"})
#: The dataclasses a checkpoint may hold, by name.
DATACLASSES = {cls.__name__: cls for cls in (Site, PooledStats, FeatureTransform,
                                                DivisiveStart)}
#: The numpy bit generators a stored ``Generator`` may use, by their state's name.
BIT_GENERATORS = {cls.__name__: cls for cls in (np.random.PCG64, np.random.PCG64DXSM,
                                                np.random.Philox, np.random.SFC64,
                                                np.random.MT19937)}
TAG = "__type__"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class StateError(ValueError):
    """A value cannot be written as state, or stored state is malformed."""


def state_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A run's state: its instance ``attributes`` (``vars(run)``) but :data:`TRANSIENT` ones."""
    return {name: value for name, value in attributes.items() if name not in TRANSIENT}


@dataclass(frozen=True)
class Snapshot:
    """A run's state as a checkpoint writes it (``Run.snapshot``): ``document`` (typed
    JSON naming its arrays by key: the class and every state attribute), the ``arrays``,
    and what the checkpoint says beside it: the run config, the last round, finished."""

    document: dict
    arrays: dict[str, np.ndarray]
    config: Any
    last_round: int
    finished: bool


def encode_state(class_name: str, attributes: Mapping[str, Any]) -> tuple[dict, dict[str, np.ndarray]]:
    """``(document, arrays)``: the state (:func:`state_attributes` of ``attributes``) of
    a run of class ``class_name`` as JSON-ready data naming its arrays by key.

    Raises
    ------
    StateError
        If an attribute holds a value of a type this module does not write (the message
        gives its path, e.g. ``repetitions[0]['stats']``).
    """
    encoder = Encoder()
    document = {
        "class": class_name,
        "attributes": {name: encoder.encode(value, name)
                       for name, value in state_attributes(attributes).items()},
    }
    return document, encoder.stored


def decode_state(document: Mapping, arrays: Mapping[str, np.ndarray], class_name: str,
                 fresh: Mapping[str, Any]) -> dict[str, Any]:
    """The attribute values of ``document`` for a run of class ``class_name`` whose
    fresh instance has the attributes ``fresh`` (``vars`` of it): a Phase written as a
    string given back as a Phase.

    Raises
    ------
    StateError
        If the document is malformed, names another strategy class, or lacks an
        attribute the fresh run has (a checkpoint of another fedcluster version).
    """
    if not isinstance(document, Mapping) or not isinstance(document.get("attributes"), Mapping):
        raise StateError("no strategy state")
    if document.get("class") != class_name:
        raise StateError(f"the state is of strategy {document.get('class')!r}, the run config "
                         f"makes a {class_name}")
    decoder = Decoder(arrays)
    values = {name: decoder.decode(value, name) for name, value in document["attributes"].items()}
    missing = sorted(set(state_attributes(fresh)) - set(values))
    if missing:
        raise StateError(f"the state lacks the attributes {', '.join(missing)}")
    for name, value in values.items():
        if name in TRANSIENT or not isinstance(name, str) or not name.isidentifier():
            raise StateError(f"{name!r} is not a state attribute")
        known = fresh.get(name)
        if isinstance(known, StrEnum) and isinstance(value, str):  # a Phase, written as a string
            try:
                values[name] = type(known)(value)
            except ValueError:
                raise StateError(f"{name}: {value!r} is not a {type(known).__name__}") from None
    return values


class Encoder:
    """Values -> JSON-ready data; the arrays collect in :attr:`stored` (key -> array)."""

    def __init__(self) -> None:
        self.stored: dict[str, np.ndarray] = {}
        self._keys: dict[int, str] = {}  # id(array) -> key (the arrays are kept alive)

    def encode(self, value: Any, path: str = "value") -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if isinstance(value, StrEnum):  # a Phase: written as the plain string it equals
            return value.value
        if kind is float:
            if math.isfinite(value):
                return value
            return {TAG: "float", "value": "nan" if math.isnan(value) else
                    ("inf" if value > 0 else "-inf")}
        if kind is list:
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if kind is dict:
            if all(type(k) is str for k in value) and TAG not in value:
                return {k: self.encode(v, f"{path}[{k!r}]") for k, v in value.items()}
            return {TAG: "dict", "items": [[self.encode(k, f"{path} key"),
                                            self.encode(v, f"{path}[{k!r}]")]
                                           for k, v in value.items()]}
        if kind is tuple:
            return {TAG: "tuple", "items": [self.encode(v, f"{path}[{i}]")
                                            for i, v in enumerate(value)]}
        if kind in (set, frozenset):
            try:
                items = sorted(value)
            except TypeError:
                items = list(value)
            return {TAG: kind.__name__, "items": [self.encode(v, f"{path} item") for v in items]}
        if kind is np.ndarray:
            return {TAG: "ndarray", "key": self._array(value, path)}
        if isinstance(value, np.generic) and kind.__module__ == "numpy":
            return self._scalar(value, path)
        if kind is np.random.Generator:
            state = value.bit_generator.state
            if state.get("bit_generator") not in BIT_GENERATORS:
                raise StateError(f"{path}: a Generator on {state.get('bit_generator')!r} "
                                 "cannot be stored")
            return {TAG: "generator", "state": self.encode(state, f"{path}.state")}
        if dataclasses.is_dataclass(value) and DATACLASSES.get(kind.__name__) is kind:
            return {TAG: "dataclass", "name": kind.__name__,
                    "fields": {f.name: self.encode(getattr(value, f.name), f"{path}.{f.name}")
                               for f in dataclasses.fields(value)}}
        raise StateError(f"{path}: a {kind.__module__}.{kind.__qualname__} cannot be stored "
                         "in a checkpoint (strategies/state.py lists what can)")

    def _array(self, array: np.ndarray, path: str) -> str:
        if array.dtype.hasobject:
            raise StateError(f"{path}: an array of Python objects cannot be stored")
        key = self._keys.get(id(array))
        if key is None:
            key = self._keys[id(array)] = f"a{len(self.stored)}"
            self.stored[key] = array
        return key

    def _scalar(self, value: np.generic, path: str) -> dict:
        dtype = value.dtype
        if dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize <= 8):
            return {TAG: "scalar", "dtype": dtype.str, "value": self.encode(value.item(), path)}
        return {TAG: "scalar", "key": self._array(np.asarray(value), path)}


class Decoder:
    """JSON data -> values, reading arrays from ``arrays`` (key -> array)."""

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.stored = arrays

    def decode(self, data: Any, path: str = "value") -> Any:
        if data is None or type(data) in (bool, int, float, str):
            return data
        if type(data) is list:
            return [self.decode(v, f"{path}[{i}]") for i, v in enumerate(data)]
        if type(data) is not dict:
            raise StateError(f"{path}: unexpected {type(data).__name__}")
        if TAG not in data:
            return {k: self.decode(v, f"{path}[{k!r}]") for k, v in data.items()}
        try:
            return self._tagged(data[TAG], data, path)
        except StateError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise StateError(f"{path}: malformed {data.get(TAG)!r} ({err!r})") from None

    def _tagged(self, tag: Any, data: dict, path: str) -> Any:
        if tag == "float":
            return _NON_FINITE[data["value"]]
        if tag == "dict":
            return {self.decode(k, f"{path} key"): self.decode(v, f"{path}[{k!r}]")
                    for k, v in data["items"]}
        if tag in ("tuple", "set", "frozenset"):
            items = [self.decode(v, f"{path}[{i}]") for i, v in enumerate(data["items"])]
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "ndarray":
            return self._array(data["key"], path)
        if tag == "scalar":
            if "key" in data:
                array = self._array(data["key"], path)
                if array.ndim != 0:
                    raise StateError(f"{path}: a scalar's array has shape {array.shape}")
                return array[()]
            dtype = np.dtype(str(data["dtype"]))
            if not (dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize <= 8)):
                raise StateError(f"{path}: scalar dtype {dtype} is not written inline")
            return dtype.type(self.decode(data["value"], path))
        if tag == "generator":
            state = self.decode(data["state"], f"{path}.state")
            bit_generator = BIT_GENERATORS.get(state.get("bit_generator"))
            if bit_generator is None:
                raise StateError(f"{path}: unknown bit generator {state.get('bit_generator')!r}")
            generator = bit_generator()
            generator.state = state
            return np.random.Generator(generator)
        if tag == "dataclass":
            cls = DATACLASSES.get(data["name"])
            if cls is None:
                raise StateError(f"{path}: {data['name']!r} is not a state dataclass")
            names = {f.name for f in dataclasses.fields(cls)}
            # (a field added since the checkpoint was written takes its default)
            defaulted = {f.name for f in dataclasses.fields(cls)
                         if f.default is not dataclasses.MISSING
                         or f.default_factory is not dataclasses.MISSING}
            fields = data["fields"]
            if not set(fields) <= names or names - set(fields) - defaulted:
                raise StateError(f"{path}: {data['name']} fields {sorted(fields)}, "
                                 f"expected {sorted(names)}")
            return cls(**{k: self.decode(v, f"{path}.{k}") for k, v in fields.items()})
        raise StateError(f"{path}: unknown type tag {tag!r}")

    def _array(self, key: Any, path: str) -> np.ndarray:
        if type(key) is not str or key not in self.stored:
            raise StateError(f"{path}: no array {key!r} in the checkpoint's arrays")
        return self.stored[key]


def decode(data: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The value :meth:`Encoder.encode` wrote as ``data`` (arrays from ``arrays``)."""
    return Decoder(arrays).decode(data)

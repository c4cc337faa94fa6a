"""The request a router sees: what it asks for, and the pressure around it.

A :class:`Request` is a plain frozen dataclass: reading its fields costs tens of
nanoseconds. Building one through its ``__init__`` does not: a frozen dataclass sets
each of its fields through ``object.__setattr__``, which costs more than the routing
decision it feeds (``bench/serving_path.py`` times both), so the server builds its
requests as :func:`serving_request` does, without ``__init__`` (the server's
``modeswitch.engine.serving.routing.route`` inlines its body). Validation happens where untrusted data enters, in
:func:`read_requests`, through pydantic (errors name file, row and field); code that
builds requests itself can call :func:`validate_request`.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

from modeswitch.dataset.errors import InputError, InputFileError

NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]


@dataclass(frozen=True)
class Request:
    """One LLM request with the cheap facts a router may use.

    ``prompt_tokens`` is the prompt's token count; when it is known (it is, once a
    request has been tokenised for the engine) no tokenizer runs at routing time.
    ``memory_pressure`` is the fraction of accelerator memory already taken by
    others (0 if none); ``concurrent_requests`` counts requests in flight
    including this one.
    """

    id: str
    prompt_tokens: NonNegInt
    expected_output_tokens: PosInt
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    shared_prefix_tokens: NonNegInt = 0
    concurrent_requests: PosInt = 1
    memory_pressure: Fraction = 0.0
    family: str | None = None
    workload: str | None = None
    benchmark_suite: str | None = None
    evaluation_mode: str | None = None
    reference: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


_new = object.__new__


def serving_request(id: str, prompt_tokens: int, expected_output_tokens: int,
                    shared_prefix_tokens: int, concurrent_requests: int,
                    memory_pressure: float, prompt_token_ids=None) -> Request:
    """A :class:`Request` from values the caller has already checked (counts it computed
    itself, as the server does), about 5x cheaper than ``Request(...)``.

    Why it is the same object: ``Request`` keeps no slots, so its instance dict holds the
    values given here and the class holds every other field's default (a dataclass leaves
    plain defaults as class attributes); equality, ``repr``, ``asdict``, pickling and the
    frozen guard on assignment behave as for ``Request(...)`` (tested). No checks run:
    untrusted data goes through :func:`validate_request`."""
    r = _new(Request)
    d = r.__dict__
    d["id"] = id
    d["prompt_tokens"] = prompt_tokens
    d["expected_output_tokens"] = expected_output_tokens
    d["shared_prefix_tokens"] = shared_prefix_tokens
    d["concurrent_requests"] = concurrent_requests
    d["memory_pressure"] = memory_pressure
    d["prompt_token_ids"] = prompt_token_ids
    return r


#: the fields :func:`serving_request` (and ``route()``) write, in order; the rest keep
#: their class defaults (tests check both builders write exactly these)
SERVING_FIELDS = ("id", "prompt_tokens", "expected_output_tokens", "shared_prefix_tokens", "concurrent_requests",
                  "memory_pressure", "prompt_token_ids")


def _serving_request_holds() -> None:
    """What :func:`serving_request` (and the server's ``modeswitch.engine.serving.routing.route``,
    which inlines its body) relies on, checked at import: every field it leaves out has a
    plain default (a class attribute), and no ``__post_init__`` would be skipped."""
    bare = [f.name for f in fields(Request) if f.name not in SERVING_FIELDS and f.default is MISSING]
    if bare or hasattr(Request, "__post_init__") or hasattr(Request, "__slots__"):
        raise TypeError(f"serving_request (and route(), which inlines it) cannot build a Request: fields "
                        f"without a plain default {bare}, a __post_init__ or slots; give them those fields "
                        "or build Request(...)")


_serving_request_holds()


REQUEST_FIELDS = tuple(f.name for f in fields(Request))
_ADAPTER = TypeAdapter(Request)


def validate_request(data: dict) -> Request:
    """Validate a mapping into a Request (pydantic); raises pydantic's ValidationError."""
    req = _ADAPTER.validate_python(data)
    if req.shared_prefix_tokens > req.prompt_tokens:
        raise InputError(
            f"shared_prefix_tokens ({req.shared_prefix_tokens}) exceeds "
            f"prompt_tokens ({req.prompt_tokens})"
        )
    return req


def _clean(value):
    """Turn pandas' missing markers into None so optional fields stay missing."""
    try:
        import pandas as pd  # pandas only when a table is read or built: a Request alone (the serving path) needs none

        if value is None or (not isinstance(value, (list, tuple, str)) and pd.isna(value)):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list):
        value = tuple(value)
    return value


def requests_from_records(records, path=None) -> list[Request]:
    """Validate row dicts into Requests; the first bad row raises InputFileError."""
    out = []
    for row, rec in enumerate(records):
        data = {k: _clean(v) for k, v in rec.items() if k in REQUEST_FIELDS}
        data = {k: v for k, v in data.items() if v is not None}
        if "id" in data:
            data["id"] = str(data["id"])
        try:
            out.append(validate_request(data))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            raise InputFileError(path, row, field, err["msg"]) from None
        except ValueError as exc:
            raise InputFileError(path, row, "shared_prefix_tokens", str(exc)) from None
    ids = [r.id for r in out]
    if len(set(ids)) != len(ids):
        seen = set()
        for row, rid in enumerate(ids):
            if rid in seen:
                raise InputFileError(path, row, "id", f"duplicate request id {rid!r}")
            seen.add(rid)
    return out


def read_requests(path) -> list[Request]:
    """Read requests from JSONL, CSV or parquet, validating every row."""
    import pandas as pd  # pandas only when a table is read or built: a Request alone (the serving path) needs none

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"requests file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        df = pd.read_json(path, lines=True, dtype=False)
    elif suffix == ".csv":
        df = pd.read_csv(path)
    elif suffix == ".parquet":
        df = pd.read_parquet(path)
    else:
        raise InputFileError(path, None, None, "unknown format: use .jsonl, .csv or .parquet")
    return requests_from_records(df.to_dict(orient="records"), path=path)


def requests_frame(requests):
    """A DataFrame with one row per request and one column per Request field."""
    import pandas as pd  # pandas only when a table is read or built: a Request alone (the serving path) needs none

    return pd.DataFrame([r.to_dict() for r in requests], columns=list(REQUEST_FIELDS))

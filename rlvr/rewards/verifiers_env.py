"""verifiers: score with a verifiers (v1) taskset's own rewards (rows from a `[domains.NAME.verifiers]` table).

A verifiers taskset (`import verifiers.v1 as vf`) is a `vf.Taskset` whose `load()` yields typed `vf.Task`s:
the data (prompt, system prompt, the task's own fields) and an async `score(trace)` that runs the task's
`@vf.reward` and `@vf.metric` methods on a `vf.Trace`. A row of a verifiers domain carries what rebuilds
its task here (`sample.extra["verifiers"]`: the taskset, its config keys and the task's data); the
completion becomes the trace's one sampled assistant message, and the verdict is the trace's weighted
reward sum, rlvr adds no matching of its own. Each named reward and metric goes into
`info["subscores"]`, which the pool logs as `reward/<domain>/sub/<name>`. A score that raises (or
gives no number) could not judge: failed, never a 0 to train on.

Only single-turn tasksets are taken: one prompt, one reply, scoring that needs no runtime. A taskset
with tools, a container, its own environment (a user simulator) or setup in a runtime is refused in
one line (`single_turn_problem`), at validate and at load. verifiers is imported only when a
verifiers domain is met (its import takes seconds), never by `rlvr validate` on other recipes.
docs/rewards.md ("verifiers domains").
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import itertools
import json
import math
from typing import Any

from rlvr.rewards.args import reject_unknown_args
from rlvr.rewards.base import describe_exception, failed
from rlvr.rewards.registry import register
from rlvr.types import Completion, RewardResult, Sample

INSTALL = "pip install -e '.[verifiers]'"
NAMESPACE = "verifiers.v1.tasksets"
"""Where verifiers keeps the tasksets it ships; an id names one of them before any other module."""


class VerifiersMissing(ImportError):
    """verifiers is not installed; `str()` says how to install it."""


class TasksetError(ValueError):
    """A taskset reference or its config keys that do not work: `key` is the recipe key under the
    verifiers table it is about (`taskset`, `args.n`), `str()` the one line a user reads."""

    def __init__(self, key: tuple[str, ...], message: str):
        super().__init__(message)
        self.key = key


def verifiers() -> Any:
    """`verifiers.v1`, or VerifiersMissing with the install command."""
    try:
        import verifiers.v1 as vf  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        raise VerifiersMissing(f"verifiers is not installed: {INSTALL}") from exc
    return vf


def module_name(ref: str) -> str:
    """The module a taskset id imports, as verifiers derives it: `owner/name@1.0` installs as `name`,
    a dash is an underscore; a dotted module path stays as written."""
    name = ref.rsplit("/", 1)[-1].split("@", 1)[0]
    return name.replace("-", "_")


def taskset_class(ref: str) -> Any:
    """The `vf.Taskset` subclass `ref` exports in `__all__` (verifiers' own plug-in rule), imported from a
    taskset verifiers ships, the recipe's folder, PYTHONPATH or the installed packages."""
    from rlvr.plugins import PluginError, import_plugin_module

    vf = verifiers()
    module = module_name(ref)
    try:
        namespaced = importlib.util.find_spec(f"{NAMESPACE}.{module}") is not None
    except (ImportError, ValueError):
        namespaced = False
    target = f"{NAMESPACE}.{module}" if namespaced else module
    try:
        imported = import_plugin_module(target, ref=ref, kind="verifiers taskset")
    except PluginError as exc:
        cause = exc.__cause__
        if isinstance(cause, ModuleNotFoundError) and cause.name and target.split(".")[0] == cause.name.split(".")[0]:
            raise TasksetError(
                ("taskset",),
                f"no verifiers taskset {ref!r}: module {target!r} is not in the recipe's folder, PYTHONPATH or the "
                f"installed packages; install the environment "
                f"(pip install {module.replace('_', '-')}, or prime env install OWNER/{module}) or put {module}.py "
                "beside the recipe",
            ) from None
        raise TasksetError(("taskset",), str(exc)) from None
    names = getattr(imported, "__all__", None)
    if names is None:
        names = [n for n in dir(imported) if not n.startswith("_")]
    found = [
        obj
        for n in names
        if isinstance(obj := getattr(imported, n, None), type) and issubclass(obj, vf.Taskset) and obj is not vf.Taskset
    ]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({', '.join(c.__name__ for c in found)})"
        raise TasksetError(
            ("taskset",), f"module {target!r} exports {what} vf.Taskset subclasses in __all__; a taskset exports one"
        )
    return found[0]


def taskset_config(cls: Any, args: dict[str, Any], *, key: str = "args") -> Any:
    """The taskset's own config (`vf.TasksetConfig` subclass) from the recipe's keys; TasksetError
    naming the first bad key (`args.n`) and what the config says about it."""
    from pydantic import ValidationError
    from verifiers.v1.utils.generic import concrete_type  # pyright: ignore[reportMissingImports]

    vf = verifiers()
    config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    try:
        return config_cls.model_validate(dict(args))
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(str(part) for part in error["loc"])
        fields = sorted(n for n in config_cls.model_fields if n not in ("task", "system_prompt", "id"))
        takes = f"; {cls.__name__} takes {', '.join(fields) or 'no keys'}" if error["type"] == "extra_forbidden" else ""
        got = "" if error["type"] in ("extra_forbidden", "missing") else f" (got {error.get('input')!r})"
        raise TasksetError((key, *loc), f"{cls.__name__}: {error['msg']}{got}{takes}") from None


def single_turn_problem(cls: Any, config: Any) -> str | None:
    """None for a taskset rlvr can run (one prompt, one reply, scored without a runtime), else why not,
    in one line. rlvr's engines generate one reply per prompt here; tools, containers, a user simulator
    or a runtime would need verifiers' harness talking to them token-in-token-out, which is not built."""
    vf = verifiers()
    name = cls.__name__
    task_cls = cls.task_type()
    why = None
    if cls.toolsets(config):
        why = "its taskset has tool servers"
    elif task_cls.toolsets(config.task):
        why = "its tasks have tool servers"
    elif task_cls.NEEDS_CONTAINER:
        why = "its tasks need a container"
    elif task_cls.setup is not vf.Task.setup:
        why = "its tasks set up a runtime"
    elif needs := _runtime_rewards(task_cls, config.task):
        why = f"its rewards read a runtime: {', '.join(needs)}"
    else:
        module = importlib.import_module(cls.__module__)
        envs = [
            o
            for n in getattr(module, "__all__", [])
            if isinstance(o := getattr(module, n, None), type) and issubclass(o, vf.Env) and o is not vf.Env
        ]
        if envs:
            why = f"it brings its own environment ({envs[0].__name__}: several agents or turns)"
    if why is None:
        return None
    return f"{name} is multi-turn ({why}); rlvr runs single-turn verifiers tasksets only (one prompt, one reply)"


def _runtime_rewards(task_cls: Any, task_config: Any) -> list[str]:
    """The task's rewards and metrics that take a `runtime` without a default: scored offline, verifiers
    would skip them (a reward that never counts); they need the sandbox the agent worked in."""
    import inspect

    probe = task_cls.__new__(task_cls)  # the hooks are found on the class; no task data is needed
    probe.config = task_config
    out = []
    for kind in ("reward", "metric"):
        for fn in probe.hooks(kind):
            param = inspect.signature(fn).parameters.get("runtime")
            if param is not None and param.default is inspect.Parameter.empty:
                out.append(fn.__name__)
    return out


@functools.lru_cache(maxsize=32)
def _loaded(ref: str, args_json: str) -> tuple[Any, Any]:
    """(taskset class, its config) for one taskset and its keys, made once per process."""
    cls = taskset_class(ref)
    return cls, taskset_config(cls, json.loads(args_json))


def loaded(ref: str, args: dict[str, Any]) -> tuple[Any, Any]:
    return _loaded(ref, json.dumps(args, sort_keys=True, default=str))


def task_data(ref: str, args: dict[str, Any], *, limit: int | None) -> list[Any]:
    """The data (`vf.TaskData`) of the first `limit` tasks (all when None) of the taskset `ref` with config
    keys `args`, as iterating the taskset gives it: `idx` its position in `load()`, the config's
    system prompt file over the task's own. Read from `load()` here rather than through the taskset's
    iterator, which copies every task to set two fields (4/5 of a row's cost); a row needs the data only."""
    cls, config = loaded(ref, args)
    taskset = cls(config)
    update = {} if taskset.system_prompt is None else {"system_prompt": taskset.system_prompt}
    made = itertools.islice(taskset.load(), limit)
    return [task.data.model_copy(update={"idx": idx, **update}) for idx, task in enumerate(made)]


def task_row(ref: str, args: dict[str, Any], data: Any) -> dict[str, Any]:
    """What a row keeps to rebuild its task where it is scored: `sample.extra["verifiers"]`."""
    return {"taskset": ref, "args": args, "data": data.model_dump(mode="json", exclude_defaults=True)}


def row_problem(row: Any) -> str | None:
    """None if a row's `verifiers` field holds what the reward needs, else why not (a data error)."""
    if not isinstance(row, dict) or not isinstance(row.get("taskset"), str) or not isinstance(row.get("data"), dict):
        return (
            "verifiers rows need a 'verifiers' object: {taskset, args, data} (rows of a [domains.NAME.verifiers] "
            "domain have it)"
        )
    return None


def rebuild(row: dict[str, Any]) -> Any:
    """The row's task: its taskset's task type around the row's data, with the taskset's task config."""
    cls, config = loaded(row["taskset"], row.get("args") or {})
    task_cls = cls.task_type()
    return task_cls(task_cls.data_type().model_validate(row["data"]), config.task)


def trace_of(task: Any, text: str) -> Any:
    """A `vf.Trace` of `task` whose one sampled message is the reply `text` (what `last_reply` reads)."""
    vf = verifiers()
    from verifiers.v1.configs.agent import AgentConfig  # pyright: ignore[reportMissingImports]
    from verifiers.v1.trace import AgentInfo, TraceTask  # pyright: ignore[reportMissingImports]

    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data),
        agent=AgentInfo(config=AgentConfig()),
        nodes=[vf.MessageNode(message=vf.AssistantMessage(content=text), sampled=True)],
    )


async def score_task(task: Any, text: str) -> RewardResult:
    """The task's own verdict on `text`: its weighted reward sum, each reward and metric in `subscores`."""
    trace = trace_of(task, text)
    try:
        await task.score(trace)
    except Exception as exc:  # noqa: BLE001 - a score that raises could not judge: failed, not a 0
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        return failed(f"{type(task).__name__}.score raised {describe_exception(cause)}", error=True)
    missing = [name for name, reward in trace.rewards.items() if reward is None]
    if missing:
        return failed(f"{type(task).__name__}.score left {', '.join(missing)} without a value")
    value = float(trace.reward)
    if not math.isfinite(value):
        return failed(f"{type(task).__name__}.score gave {value}")
    subscores = {name: reward.score for name, reward in trace.rewards.items()}
    subscores.update({name: v for name, v in trace.metrics.items() if v is not None})
    info: dict[str, Any] = {"subscores": subscores}
    if value == 0:
        info["reason"] = f"{type(task).__name__}'s rewards gave 0 ({', '.join(trace.rewards) or 'none'})"
    return RewardResult(value, info)


def judge_row(row: dict[str, Any], text: str, *, sample_id: str) -> RewardResult:
    """One verdict, in a reward worker process: the row's task rebuilt, its `score` run on `text`."""
    try:
        task = rebuild(row)
    except (VerifiersMissing, TasksetError) as exc:
        return failed(str(exc))
    except Exception as exc:  # noqa: BLE001 - data the taskset's own type no longer takes: could not judge
        return failed(f"row {sample_id}: rebuilding its task raised {describe_exception(exc)}", error=True)
    return _worker_loop().run_until_complete(score_task(task, text))


@functools.cache
def _worker_loop() -> asyncio.AbstractEventLoop:
    """One event loop per worker process, kept: `asyncio.run` would make and close one per verdict
    (most of the plumbing's cost, ~0.8 ms a sample)."""
    return asyncio.new_event_loop()


def _warmup() -> None:
    """Worker preload: import verifiers (seconds) before the first verdict waits for it."""
    verifiers()


POOL = "verifiers"
PRELOAD = ("rlvr.rewards.verifiers_env:_warmup",)


@register("verifiers")
async def score(sample: Sample, completion: Completion, **reward_args: Any) -> RewardResult:
    """Score with the verifiers taskset's own rewards (rows from a verifiers table)."""
    reject_unknown_args("verifiers", reward_args)
    row = sample.extra.get("verifiers")
    if problem := row_problem(row):
        return failed(f"row {sample.id}: {problem}")
    assert isinstance(row, dict)
    text = completion.text if isinstance(completion.text, str) else ""
    # The task's rewards are async functions but usually CPU work (math-verify, parsers): run in the reward
    # worker processes, as math_rule does, they leave the controller's event loop free, use the cores, and a
    # scorer stuck past the deadline is killed (its worker replaced).
    from rlvr.rewards.workers import shared_pool

    pool = shared_pool(POOL, max_workers=reward_args.get("max_workers"), preload=PRELOAD)
    timeout_s = float(reward_args.get("timeout_s", 30.0))
    job = await pool.call(f"{__name__}:judge_row", row, text, sample_id=sample.id, timeout_s=timeout_s)
    if job.status == "ok":
        return job.value
    if job.status == "timeout":
        return failed(f"{row['taskset']}: no verdict within timeout_s = {timeout_s:g} s", timeout=True)
    return failed(f"{row['taskset']}: the reward worker failed: {job.error or job.status}", error=True)

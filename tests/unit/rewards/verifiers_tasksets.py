"""Verifiers (v1) tasksets written for the tests, as module sources a test puts beside its recipe: one
single-turn taskset rlvr runs, and multi-turn ones it refuses (tests/unit/rewards/test_verifiers_env.py,
tests/integration/test_verifiers_launch.py, bench/verifiers_env.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

SUMS = '''
"""Single-turn: "What is a + b?", answered in \\\\boxed{}; `correct` is the reward, `chars` a metric."""
import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumsConfig(vf.TasksetConfig):
    n: int = 8
    split: str = "train"
    explode: bool = False


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        if "explode" in task.answer:
            raise RuntimeError("the checker is down")
        return float(vf.extract_boxed_answer(trace.last_reply, strict=True).strip() == task.answer)

    @vf.metric
    async def chars(self, trace) -> float:
        return float(len(trace.last_reply))


class SumsTaskset(vf.Taskset[SumTask, SumsConfig]):
    def load(self):
        start = 100 if self.config.split == "test" else 0
        for i in range(start, start + self.config.n):
            a, b = i % 7, i % 5
            answer = "explode" if self.config.explode else str(a + b)
            data = SumData(
                prompt=f"What is {a} + {b}?", system_prompt="Put the answer in \\\\boxed{}.", answer=answer
            )
            yield SumTask(data, self.config.task)


__all__ = ["SumsTaskset"]
'''

CHAT = '''
"""Multi-turn: the taskset brings its own environment (two agents talking), as user-sim does."""
import verifiers.v1 as vf


class ChatTaskset(vf.Taskset):
    def load(self):
        yield vf.Task(vf.TaskData(prompt="hello"))


class ChatEnv(vf.Env):
    async def run(self, task, agents):
        return None


__all__ = ["ChatTaskset", "ChatEnv"]
'''

SETUP = '''
"""Multi-turn: each task prepares a runtime (a sandbox the agent works in) before the agent runs."""
import verifiers.v1 as vf


class BoxTask(vf.Task):
    async def setup(self, trace, runtime):
        await runtime.write("/task.txt", b"fix the bug")


class BoxTaskset(vf.Taskset[BoxTask]):
    def load(self):
        yield BoxTask(vf.TaskData(prompt="fix the bug in /task.txt"))


__all__ = ["BoxTaskset"]
'''

USER_OPENS = '''
"""Multi-turn: no prompt; the user (a simulator) opens the conversation."""
import verifiers.v1 as vf


class OpenTaskset(vf.Taskset):
    def load(self):
        yield vf.Task(vf.TaskData(prompt=None, system_prompt="You are a helpful agent."))


__all__ = ["OpenTaskset"]
'''

GRADED_IN_BOX = '''
"""Multi-turn: the reward reads the files the agent left in its sandbox."""
import verifiers.v1 as vf


class FileTask(vf.Task):
    @vf.reward
    async def tests_pass(self, trace, runtime) -> float:
        return float((await runtime.read("/out.txt")) == b"ok")


class FileTaskset(vf.Taskset[FileTask]):
    def load(self):
        yield FileTask(vf.TaskData(prompt="write ok to /out.txt"))


__all__ = ["FileTaskset"]
'''

MODULES = {
    "toy_sums": SUMS,
    "toy_chat": CHAT,
    "toy_setup": SETUP,
    "toy_user_opens": USER_OPENS,
    "toy_graded_in_box": GRADED_IN_BOX,
}


def write_tasksets(folder: Path) -> Path:
    """Every taskset module above, as `<name>.py` in `folder` (beside a recipe: imported from there)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in MODULES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source).lstrip())
    return folder


TOY_RECIPE = """
[experiment]
name = "t"

[model]
config = { hidden_size = 32 }
dtype = "float32"

[domains.sums]
tags = ["sums"]
reward = "verifiers"

[domains.sums.verifiers]
taskset = "toy_sums"
args = { n = 6 }
eval_args = { split = "test", n = 3 }

[rollout]
n = 2
temperature = 0.7
"""


def write_recipe(folder: Path, recipe: str = TOY_RECIPE) -> Path:
    """`recipe` as folder/recipe.toml, the tasksets beside it (where the recipe imports them from)."""
    write_tasksets(folder)
    path = folder / "recipe.toml"
    path.write_text(textwrap.dedent(recipe))
    return path


def toy_sums_row(folder: Path):
    """A row of `toy_sums` as a verifiers domain loads it (the task its own rewards score), for tests
    that run every reward. The caller restores sys.path and drops the MODULES it imported."""
    from rlvr.data.sources import load_recipe_domains
    from rlvr.plugins import add_plugin_dir
    from rlvr.recipe.load import load_recipe

    recipe = load_recipe(write_recipe(folder), [])
    add_plugin_dir(folder)
    return load_recipe_domains(recipe)[0]["sums"][1]

# docs/examples/sums_taskset.py: a single-turn verifiers (v1) taskset, `taskset = "sums_taskset"` in a recipe beside it
import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str  # the task's own fields ride with the row to where it is scored


class SumsConfig(vf.TasksetConfig):
    size: int = 200
    split: str = "train"  # "test": other questions, for the eval rows


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return vf.verify_boxed_math_answer(trace.last_reply, task.answer)  # math-verify on the \boxed{} answer

    @vf.reward(weight=0.1)
    async def boxed(self, trace) -> float:
        return float("\\boxed{" in trace.last_reply)

    @vf.metric
    async def words(self, trace) -> float:
        return float(len(trace.last_reply.split()))


class SumsTaskset(vf.Taskset[SumTask, SumsConfig]):
    def load(self):
        first = 1000 if self.config.split == "test" else 0
        for i in range(first, first + self.config.size):
            a, b = i % 37, (7 * i) % 41
            yield SumTask(
                SumData(
                    prompt=f"What is {a} + {b}?",
                    system_prompt="Answer with the number in \\boxed{}.",
                    answer=str(a + b),
                ),
                self.config.task,
            )


__all__ = ["SumsTaskset"]

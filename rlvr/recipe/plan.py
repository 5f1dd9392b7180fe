"""Recipe -> LaunchPlan: who runs where. Pure data, no processes, so it is golden-testable.

On SLURM the first `cluster.trainer_nodes` nodes run trainer ranks (one per GPU, torchrun
rendezvous on the first node) and the remaining nodes run rollout servers (one SGLang
server per `tp_size * dp_size` GPUs, or one embedded server per GPU / per CPU node).

Locally, `trainer.ranks` processes and `rollout.servers` servers share this host and its GPUs
(`cluster.gpus_per_node`, default the visible ones): split, the trainer takes GPUs 0..ranks-1
and each server the next `rollout.gpus_per_server`; colocated (`rollout.colocate`), the servers
lie on the trainer's GPUs from GPU 0 and sleep while it trains. Each child is started with its
GPUs as CUDA_VISIBLE_DEVICES (`rlvr.launch.local`), so a plan that does not fit is refused here,
before any process starts, not as an out-of-memory or a device-ordinal error minutes later.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from rlvr.recipe.machine import visible_gpus
from rlvr.recipe.schema import Recipe


@dataclass(frozen=True)
class ServerSpec:
    """One rollout server: where it runs and which GPUs it owns."""

    index: int
    node: int  # index into the allocation's node list (0 on a local run)
    port: int
    gpus: list[int] = field(default_factory=list)
    engine: str = "embedded"


@dataclass(frozen=True)
class LaunchPlan:
    kind: str
    nodes: int
    gpus_per_node: int
    trainer_nodes: list[int]
    trainer_procs_per_node: int
    servers: list[ServerSpec]
    master_port: int
    tp_size: int = 1  # trainer tensor-parallel group size (consecutive ranks, within a node)
    trainer_gpus: list[int] = field(default_factory=list)  # local: the GPUs of the trainer's ranks, in rank order
    colocate: bool = False  # local: servers share the trainer's GPUs (rollout.colocate)

    @property
    def trainer_world_size(self) -> int:
        return len(self.trainer_nodes) * self.trainer_procs_per_node

    @property
    def dp_size(self) -> int:
        """Trainer model replicas: FSDP2 shards each over `dp_size` ranks, TP splits it over `tp_size`."""
        return self.trainer_world_size // self.tp_size

    def to_dict(self) -> dict:
        data = asdict(self)
        data["trainer_world_size"] = self.trainer_world_size
        data["dp_size"] = self.dp_size
        return data


class PlanError(ValueError):
    """The cluster shape cannot host the recipe (e.g. tp_size larger than a node)."""


def make_plan(recipe: Recipe, *, master_port: int = 29500) -> LaunchPlan:
    cluster, rollout = recipe.cluster, recipe.rollout
    if cluster.kind == "local":
        return _local_plan(recipe, master_port=master_port)
    gpus = cluster.gpus_per_node
    per_server = rollout.gpus_per_server
    if gpus and per_server > gpus:
        what = "rollout.sglang.tp_size * dp_size" if rollout.engine == "sglang" else f"rollout.{rollout.engine}.tp_size"
        raise PlanError(f"{what} = {per_server} GPUs per server, but cluster.gpus_per_node = {gpus}")
    servers: list[ServerSpec] = []
    for node in range(cluster.trainer_nodes, cluster.nodes):
        if gpus == 0:
            servers.append(ServerSpec(index=len(servers), node=node, port=rollout.base_port, engine=rollout.engine))
            continue
        for slot in range(gpus // per_server):
            servers.append(
                ServerSpec(
                    index=len(servers),
                    node=node,
                    port=rollout.base_port + slot,
                    gpus=list(range(slot * per_server, (slot + 1) * per_server)),
                    engine=rollout.engine,
                )
            )
    return LaunchPlan(
        kind="slurm",
        nodes=cluster.nodes,
        gpus_per_node=gpus,
        trainer_nodes=list(range(cluster.trainer_nodes)),
        trainer_procs_per_node=max(gpus, 1),
        servers=servers,
        master_port=master_port,
        tp_size=recipe.trainer.tp_size,
    )


PLAN_GPUS_ENV = "RLVR_PLAN_GPUS"
TRAINER_RESTART_ENV = "RLVR_TRAINER_RESTART"
"""How many times the launcher restarted the trainer (0: its first start): a restarted trainer pushes
its weights before the first wave even without a checkpoint, since the servers kept the dead one's."""
"""Set by the local launcher for its children: the GPU count it divided. A trainer rank sees only
its own GPUs (CUDA_VISIBLE_DEVICES), yet recomputes the launcher's plan (how many servers to wait for)."""


def local_gpus(recipe: Recipe) -> int:
    """The GPUs a local run divides: `cluster.gpus_per_node`, else the launcher's count (in its
    children), else the ones this machine shows."""
    return recipe.cluster.gpus_per_node or int(os.environ.get(PLAN_GPUS_ENV) or 0) or visible_gpus()


def _local_plan(recipe: Recipe, *, master_port: int) -> LaunchPlan:
    rollout, ranks = recipe.rollout, recipe.trainer.ranks
    gpus, per_server, colocate = local_gpus(recipe), rollout.gpus_per_server, rollout.colocate
    trainer_gpus: list[int] = []
    server_gpus: list[list[int]] = [[] for _ in range(rollout.servers)]
    if gpus:
        check_local_split(recipe, gpus=gpus)
        trainer_gpus = list(range(ranks))
        first = 0 if colocate else ranks
        server_gpus = [
            list(range(first + i * per_server, first + (i + 1) * per_server)) for i in range(rollout.servers)
        ]
    servers = [
        ServerSpec(index=i, node=0, port=rollout.base_port + i, gpus=server_gpus[i], engine=rollout.engine)
        for i in range(rollout.servers)
    ]
    return LaunchPlan(
        kind="local",
        nodes=1,
        gpus_per_node=gpus,
        trainer_nodes=[0],
        trainer_procs_per_node=ranks,
        servers=servers,
        master_port=master_port,
        tp_size=recipe.trainer.tp_size,
        trainer_gpus=trainer_gpus,
        colocate=colocate and bool(gpus),
    )


def server_gpus_key(recipe: Recipe) -> str:
    """The recipe keys that set one server's GPU count, as a user would write them."""
    engine = recipe.rollout.engine
    if engine == "sglang":
        return "rollout.sglang.tp_size x dp_size"
    return "rollout.vllm.tp_size" if engine == "vllm" else "1"


def check_local_split(recipe: Recipe, *, gpus: int) -> None:
    """Raise PlanError, in one line naming the keys, when the trainer and the servers do not fit
    `gpus` GPUs: side by side (split), or each within them (colocated)."""
    rollout, ranks = recipe.rollout, recipe.trainer.ranks
    per_server = rollout.gpus_per_server
    served = rollout.servers * per_server
    source = "cluster.gpus_per_node" if recipe.cluster.gpus_per_node else "the visible GPUs"
    servers = (
        f"rollout.servers x {server_gpus_key(recipe)} = {rollout.servers} x {per_server}"
        if rollout.engine != "embedded"
        else f"rollout.servers (1 GPU each) = {rollout.servers}"
    )
    if rollout.colocate:
        for what, need in ((f"trainer.ranks = {ranks}", ranks), (servers, served)):
            if need > gpus:
                raise PlanError(f"{what} GPUs, but {source} = {gpus} (colocated: each must fit them)")
        return
    if ranks + served > gpus:
        raise PlanError(
            f"trainer.ranks = {ranks} plus {servers} = {ranks + served} GPUs, but {source} = {gpus}; "
            "lower them, or set rollout.colocate = true to share the GPUs"
        )


NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/run/user")
"""Folders each node of a cluster has its own copy of: a path under one on the submitting machine is
a different (usually empty) folder on a compute node. `rlvr sbatch` and a SLURM `launch` warn about
the recipe's paths there, and the hub cache (`rlvr.recipe.hub`) is refused there."""


def node_local_root(path: str) -> str | None:
    """The `NODE_LOCAL` root `path` lies under (a folder, not a prefix: /tmpfs-shared is not /tmp), or None."""
    return next((root for root in NODE_LOCAL if path == root or path.startswith(root + "/")), None)

"""Recipe -> LaunchPlan: who runs where. Pure data, no processes, so it is golden-testable.

On SLURM the first `cluster.trainer_nodes` nodes run trainer ranks (one per GPU, torchrun
rendezvous on the first node) and the remaining nodes run rollout servers (one SGLang
server per `tp_size * dp_size` GPUs, or one embedded server per GPU / per CPU node).
Locally, `trainer.ranks` processes and `rollout.servers` embedded servers share this host.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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
        servers = [
            ServerSpec(index=i, node=0, port=rollout.base_port + i, engine=rollout.engine)
            for i in range(rollout.servers)
        ]
        return LaunchPlan(
            kind="local",
            nodes=1,
            gpus_per_node=cluster.gpus_per_node,
            trainer_nodes=[0],
            trainer_procs_per_node=recipe.trainer.ranks,
            servers=servers,
            master_port=master_port,
            tp_size=recipe.trainer.tp_size,
        )
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

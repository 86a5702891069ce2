"""The unmodified Kubeflow SDK (PyPI `kubeflow`) against a trainhub hub with
two local process spokes: list_runtimes, train a CustomTrainer on two nodes,
wait for it to complete, read each node's logs, delete it.

Usage: python3 sdk.py KUBECONFIG
Exits non-zero with a message on the first failed expectation.
"""

import sys

from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import CustomTrainer, TrainerClient


def train_fn():
    import os

    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    print(f"hello from rank {rank} of {world} via {os.environ['MASTER_ADDR']}")


def main(kubeconfig: str) -> None:
    client = TrainerClient(
        backend_config=KubernetesBackendConfig(config_file=kubeconfig, namespace="default")
    )

    runtimes = {r.name: r for r in client.list_runtimes()}
    for name in ("torch-distributed", "python-distributed"):
        assert name in runtimes, f"list_runtimes() lacks {name}: {sorted(runtimes)}"
    runtime = client.get_runtime("python-distributed")
    assert runtime.trainer.framework == "python", runtime

    name = client.train(
        runtime=runtime,
        trainer=CustomTrainer(func=train_fn, num_nodes=2),
    )
    job = client.get_job(name)
    assert job.name == name, job
    assert job.runtime.name == "python-distributed", job
    assert job.num_nodes == 2, job
    jobs = [j.name for j in client.list_jobs()]
    assert name in jobs, f"list_jobs() lacks {name}: {jobs}"

    job = client.wait_for_job_status(name, status={"Complete"}, timeout=180, polling_interval=1)
    assert job.status == "Complete", job
    nodes = sorted(s.name for s in job.steps if s.name.startswith("node"))
    assert nodes == ["node-0", "node-1"], job.steps
    for rank in (0, 1):
        logs = "\n".join(client.get_job_logs(name, step=f"node-{rank}"))
        assert f"hello from rank {rank} of 2 via 127.0.0.1" in logs, f"node-{rank} logs: {logs!r}"
        followed = "\n".join(client.get_job_logs(name, step=f"node-{rank}", follow=True))
        assert f"hello from rank {rank} of 2" in followed, f"node-{rank} followed: {followed!r}"

    # Events: the hub's placement of the TrainJob, and what the spoke
    # recorded of each node's pod.
    events = client.get_job_events(name)
    seen = {(e.involved_object_kind, e.reason) for e in events}
    assert ("TrainJob", "Placed") in seen, events
    for rank in (0, 1):
        pod = next(s.pod_name for s in job.steps if s.name == f"node-{rank}")
        reasons = {e.reason for e in events if e.involved_object_name == pod}
        assert {"Scheduled", "Started"} <= reasons, (pod, events)

    client.delete_job(name)
    jobs = [j.name for j in client.list_jobs()]
    assert name not in jobs, f"{name} still listed after delete_job(): {jobs}"
    print(f"sdk ok: runtimes={len(runtimes)} job={name}")


if __name__ == "__main__":
    main(sys.argv[1])

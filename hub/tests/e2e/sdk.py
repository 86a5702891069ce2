"""The unmodified Kubeflow SDK (PyPI `kubeflow`) against a trainhub hub.

Usage: python3 sdk.py KUBECONFIG
Exits non-zero with a message on the first failed expectation.
"""

import sys

from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import CustomTrainer, TrainerClient


def train_fn():
    print("hello from a trainhub TrainJob")


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

    client.delete_job(name)
    jobs = [j.name for j in client.list_jobs()]
    assert name not in jobs, f"{name} still listed after delete_job(): {jobs}"
    print(f"sdk ok: runtimes={len(runtimes)} job={name}")


if __name__ == "__main__":
    main(sys.argv[1])

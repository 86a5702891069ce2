//! The same simulator scenario against kmock: the cross-check.

use trainhub_kube_standin::{ApiServer, Kmock, StandinConfig};

#[tokio::test]
async fn simulator_completes_a_jobset_against_kmock() {
    let kmock = Kmock::start(StandinConfig::default())
        .await
        .expect("kmock starts (needs `pip install kmock` in $TRAINHUB_PYTHON)");
    let server = ApiServer::Kmock(kmock);
    crate::sim::completes_two_replica_jobset(&server).await;
    server.shutdown().await;
}

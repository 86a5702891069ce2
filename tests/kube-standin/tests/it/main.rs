//! Integration tests of the stand-in, the simulator and the kmock wrapper.

// Tests panic on what they did not expect.
#![allow(clippy::unwrap_used)]

mod kmock;
mod sim;
mod standin;

use std::time::Duration;

use kube::runtime::wait::{Condition, await_condition};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Waits (at most 20 s) until `name` meets `condition`, on a watch.
pub async fn wait_for<K>(api: &Api<K>, name: &str, condition: impl Condition<K>) -> K
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    match tokio::time::timeout(
        Duration::from_secs(20),
        await_condition(api.clone(), name, condition),
    )
    .await
    {
        Ok(Ok(Some(object))) => object,
        Ok(Ok(None)) => panic!("{name} was deleted while waiting"),
        Ok(Err(e)) => panic!("waiting for {name}: {e}"),
        Err(_) => panic!("{name} did not reach the condition within 20 s"),
    }
}

/// Waits (at most 20 s) until `name` is gone.
pub async fn wait_deleted<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let gone = tokio::time::timeout(
        Duration::from_secs(20),
        await_condition(api.clone(), name, |o: Option<&K>| o.is_none()),
    )
    .await;
    assert!(
        matches!(gone, Ok(Ok(None))),
        "{name} was not deleted within 20 s"
    );
}

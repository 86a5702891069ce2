//! Between Kubernetes' typed pod fields and the WIT records of a pod set.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::{Container, ContainerPort, EnvVar, Failure, Quantity, Volume, VolumeMount};

/// The record of a Kubernetes container: the fields plugins read and write.
pub fn container_record(c: &core::Container) -> Container {
    let resources = c.resources.as_ref();
    Container {
        name: c.name.clone(),
        image: c.image.clone(),
        command: c.command.clone(),
        args: c.args.clone(),
        env: c.env.iter().flatten().map(env_record).collect(),
        env_from: c
            .env_from
            .iter()
            .flatten()
            .filter_map(|e| serde_json::to_string(e).ok())
            .collect(),
        ports: c
            .ports
            .iter()
            .flatten()
            .map(|p| ContainerPort {
                name: p.name.clone(),
                container_port: p.container_port,
                protocol: p.protocol.clone(),
            })
            .collect(),
        volume_mounts: c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| VolumeMount {
                name: m.name.clone(),
                mount_path: m.mount_path.clone(),
                read_only: m.read_only,
                sub_path: m.sub_path.clone(),
            })
            .collect(),
        requests: quantities(resources.and_then(|r| r.requests.as_ref())),
        limits: quantities(resources.and_then(|r| r.limits.as_ref())),
    }
}

/// The record of a Kubernetes env var.
pub fn env_record(e: &core::EnvVar) -> EnvVar {
    EnvVar {
        name: e.name.clone(),
        value: e.value.clone(),
        value_from: e
            .value_from
            .as_ref()
            .and_then(|v| serde_json::to_string(v).ok()),
    }
}

/// The Kubernetes env var of a record.
pub fn env_var(e: &EnvVar) -> Result<core::EnvVar, Failure> {
    Ok(core::EnvVar {
        name: e.name.clone(),
        value: e.value.clone(),
        value_from: e
            .value_from
            .as_deref()
            .map(|json| {
                serde_json::from_str(json).map_err(|err| {
                    Failure::new(format!(
                        "env {}: valueFrom is not an EnvVarSource: {err}",
                        e.name
                    ))
                })
            })
            .transpose()?,
    })
}

/// The record of a Kubernetes volume: its name and the rest as JSON.
pub fn volume_record(v: &core::Volume) -> Volume {
    let mut source = serde_json::to_value(v).unwrap_or_default();
    if let Some(object) = source.as_object_mut() {
        object.remove("name");
    }
    Volume {
        name: v.name.clone(),
        source: source.to_string(),
    }
}

/// The Kubernetes volume of a record. `source` may or may not repeat the name.
pub fn volume(v: &Volume) -> Result<core::Volume, Failure> {
    let invalid = |detail: String| Failure::new(format!("volume {}: {detail}", v.name));
    let mut source: serde_json::Value = if v.source.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(&v.source).map_err(|e| invalid(format!("source is not JSON: {e}")))?
    };
    let object = source
        .as_object_mut()
        .ok_or_else(|| invalid("source is not a JSON object".to_string()))?;
    object.insert(
        "name".to_string(),
        serde_json::Value::String(v.name.clone()),
    );
    serde_json::from_value(source).map_err(|e| invalid(format!("not a Volume: {e}")))
}

/// Writes a record onto a Kubernetes container of the same name: image,
/// command and args when the record sets them; env, envFrom and resource
/// requests and limits as the record has them; ports in the record's order
/// (one the record leaves unchanged keeps its host port), and volume mounts
/// (by mount path) updated in place, so fields the record does not carry
/// (mount propagation) survive.
pub fn apply_container(record: &Container, c: &mut core::Container) -> Result<(), Failure> {
    c.name.clone_from(&record.name);
    if record.image.is_some() {
        c.image.clone_from(&record.image);
    }
    if record.command.is_some() {
        c.command.clone_from(&record.command);
    }
    if record.args.is_some() {
        c.args.clone_from(&record.args);
    }
    let env = record
        .env
        .iter()
        .map(env_var)
        .collect::<Result<Vec<_>, _>>()?;
    c.env = non_empty(env);
    let env_from = record
        .env_from
        .iter()
        .map(|json| {
            serde_json::from_str::<core::EnvFromSource>(json).map_err(|e| {
                Failure::new(format!(
                    "container {}: envFrom entry is not an EnvFromSource: {e}",
                    record.name
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    c.env_from = non_empty(env_from);

    // Ports in the record's order (a plugin may have replaced one in place);
    // a port the record leaves as it was keeps the fields the record lacks.
    let existing = c.ports.take().unwrap_or_default();
    let ports = record
        .ports
        .iter()
        .map(|port| {
            existing
                .iter()
                .find(|p| {
                    p.container_port == port.container_port
                        && p.name == port.name
                        && p.protocol == port.protocol
                })
                .cloned()
                .unwrap_or_else(|| core::ContainerPort {
                    container_port: port.container_port,
                    name: port.name.clone(),
                    protocol: port.protocol.clone(),
                    ..Default::default()
                })
        })
        .collect();
    c.ports = non_empty(ports);

    let mut mounts = c.volume_mounts.take().unwrap_or_default();
    mounts.retain(|m| {
        record
            .volume_mounts
            .iter()
            .any(|r| r.mount_path == m.mount_path)
    });
    for mount in &record.volume_mounts {
        match mounts.iter_mut().find(|m| m.mount_path == mount.mount_path) {
            Some(existing) => {
                existing.name.clone_from(&mount.name);
                existing.read_only = mount.read_only;
                existing.sub_path.clone_from(&mount.sub_path);
            }
            None => mounts.push(core::VolumeMount {
                name: mount.name.clone(),
                mount_path: mount.mount_path.clone(),
                read_only: mount.read_only,
                sub_path: mount.sub_path.clone(),
                ..Default::default()
            }),
        }
    }
    c.volume_mounts = non_empty(mounts);

    let requests = quantity_map(&record.requests);
    let limits = quantity_map(&record.limits);
    let claims = c.resources.take().and_then(|r| r.claims);
    c.resources = if requests.is_none() && limits.is_none() && claims.is_none() {
        None
    } else {
        Some(core::ResourceRequirements {
            claims,
            limits,
            requests,
        })
    };
    Ok(())
}

/// A new Kubernetes container from a record (a sidecar a plugin added).
pub fn new_container(record: &Container) -> Result<core::Container, Failure> {
    let mut c = core::Container {
        name: record.name.clone(),
        ..Default::default()
    };
    apply_container(record, &mut c)?;
    Ok(c)
}

fn quantities(map: Option<&BTreeMap<String, K8sQuantity>>) -> Vec<Quantity> {
    map.into_iter()
        .flatten()
        .map(|(name, q)| Quantity {
            name: name.clone(),
            value: q.0.clone(),
        })
        .collect()
}

fn quantity_map(list: &[Quantity]) -> Option<BTreeMap<String, K8sQuantity>> {
    if list.is_empty() {
        return None;
    }
    Some(
        list.iter()
            .map(|q| (q.name.clone(), K8sQuantity(q.value.clone())))
            .collect(),
    )
}

fn non_empty<T>(items: Vec<T>) -> Option<Vec<T>> {
    if items.is_empty() { None } else { Some(items) }
}

//! Conversions between the SDK's records (the hub's pipeline types) and the
//! host bindings' records. Both are generated from the same WIT, so the
//! conversion is field for field.

use trainhub_plugin_sdk as sdk;

use super::bindings::wit;

/// Field-for-field conversion between the two generated type families.
pub trait Convert<T> {
    fn convert(self) -> T;
}

macro_rules! identity {
    ($($t:ty),*) => { $(impl Convert<$t> for $t { fn convert(self) -> $t { self } })* };
}
identity!(String, bool, i32, u32);

impl<A: Convert<B>, B> Convert<Vec<B>> for Vec<A> {
    fn convert(self) -> Vec<B> {
        self.into_iter().map(Convert::convert).collect()
    }
}

impl<A: Convert<B>, B> Convert<Option<B>> for Option<A> {
    fn convert(self) -> Option<B> {
        self.map(Convert::convert)
    }
}

/// About the bytes an SDK record holds, for caches bounded by bytes (a
/// plugin's output is as large as the TrainJob and runtime it came from
/// make it).
pub trait Weigh {
    fn weight(&self) -> usize;
}

macro_rules! scalars {
    ($($t:ty),*) => { $(impl Weigh for $t { fn weight(&self) -> usize { 8 } })* };
}
scalars!(bool, i32, u32, sdk::ErrorKind, sdk::Capabilities);

impl Weigh for String {
    fn weight(&self) -> usize {
        24 + self.len()
    }
}

impl<T: Weigh> Weigh for Vec<T> {
    fn weight(&self) -> usize {
        24 + self.iter().map(Weigh::weight).sum::<usize>()
    }
}

impl<T: Weigh> Weigh for Option<T> {
    fn weight(&self) -> usize {
        8 + self.as_ref().map_or(0, Weigh::weight)
    }
}

impl<T: Weigh> Weigh for std::sync::Arc<T> {
    fn weight(&self) -> usize {
        (**self).weight()
    }
}

macro_rules! records {
    ($($name:ident { $($field:ident),* $(,)? })*) => {$(
        impl Weigh for sdk::$name {
            fn weight(&self) -> usize {
                0 $(+ self.$field.weight())*
            }
        }
        impl Convert<wit::$name> for sdk::$name {
            fn convert(self) -> wit::$name {
                wit::$name { $($field: self.$field.convert()),* }
            }
        }
        impl Convert<sdk::$name> for wit::$name {
            fn convert(self) -> sdk::$name {
                sdk::$name { $($field: self.$field.convert()),* }
            }
        }
    )*};
}

records! {
    Descriptor { name, version, capabilities, frameworks, pod_group_policies, reserved_env }
    FieldError { kind, field, value, detail }
    Validation { warnings, errors }
    Failure { message }
    KeyValue { key, value }
    EnvVar { name, value, value_from }
    ContainerPort { name, container_port, protocol }
    VolumeMount { name, mount_path, read_only, sub_path }
    Quantity { name, value }
    Container { name, image, command, args, env, env_from, ports, volume_mounts, requests, limits }
    Volume { name, source }
    PodSet { name, ancestor, count, containers, init_containers, volumes, pod_labels, pod_annotations, endpoints }
    RuntimeInfo { labels, annotations, ml_policy, pod_group_policy, framework, pod_sets, template }
    Target { name, labels, resources }
    Context { settings }
}

macro_rules! enums {
    ($($name:ident { $($variant:ident),* $(,)? })*) => {$(
        impl Convert<wit::$name> for sdk::$name {
            fn convert(self) -> wit::$name {
                match self { $(sdk::$name::$variant => wit::$name::$variant),* }
            }
        }
        impl Convert<sdk::$name> for wit::$name {
            fn convert(self) -> sdk::$name {
                match self { $(wit::$name::$variant => sdk::$name::$variant),* }
            }
        }
    )*};
}

enums! {
    ErrorKind { Required, Invalid, Forbidden, NotSupported, Duplicate, TooMany }
}

const CAPABILITIES: [(sdk::Capabilities, wit::Capabilities); 5] = [
    (sdk::Capabilities::VALIDATE, wit::Capabilities::VALIDATE),
    (
        sdk::Capabilities::ENFORCE_ML_POLICY,
        wit::Capabilities::ENFORCE_ML_POLICY,
    ),
    (
        sdk::Capabilities::ENFORCE_POD_GROUP_POLICY,
        wit::Capabilities::ENFORCE_POD_GROUP_POLICY,
    ),
    (sdk::Capabilities::BUILD, wit::Capabilities::BUILD),
    (sdk::Capabilities::STATUS, wit::Capabilities::STATUS),
];

impl Convert<wit::Capabilities> for sdk::Capabilities {
    fn convert(self) -> wit::Capabilities {
        CAPABILITIES
            .iter()
            .filter(|(s, _)| self.contains(*s))
            .fold(wit::Capabilities::empty(), |acc, (_, w)| acc | *w)
    }
}

impl Convert<sdk::Capabilities> for wit::Capabilities {
    fn convert(self) -> sdk::Capabilities {
        CAPABILITIES
            .iter()
            .filter(|(_, w)| self.contains(*w))
            .fold(sdk::Capabilities::empty(), |acc, (s, _)| acc | *s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_weight_counts_every_string_it_holds() {
        let container = |env: usize| sdk::Container {
            name: "node".into(),
            image: Some("pytorch".into()),
            command: Some(vec!["torchrun".into()]),
            args: None,
            env: (0..env)
                .map(|i| sdk::EnvVar {
                    name: format!("VAR_{i}"),
                    value: Some("x".repeat(100)),
                    value_from: None,
                })
                .collect(),
            env_from: vec![],
            ports: vec![],
            volume_mounts: vec![],
            requests: vec![],
            limits: vec![],
        };
        let info = |template: usize, env: usize, pods: usize| sdk::RuntimeInfo {
            labels: vec![],
            annotations: vec![],
            ml_policy: "{}".into(),
            pod_group_policy: None,
            framework: None,
            pod_sets: vec![sdk::PodSet {
                name: "node".into(),
                ancestor: None,
                count: 1,
                containers: vec![container(env)],
                init_containers: vec![],
                volumes: vec![],
                pod_labels: vec![],
                pod_annotations: vec![],
                endpoints: (0..pods).map(|i| format!("job-node-0-{i}.job")).collect(),
            }],
            template: "{".repeat(template),
        };
        let small = info(100, 1, 2).weight();
        assert!(small > 100 && small < 2000, "{small}");
        // The template, the env and the endpoints all count.
        assert!(info(1 << 20, 1, 2).weight() > 1 << 20);
        assert!(info(100, 10_000, 2).weight() > 10_000 * 100);
        assert!(info(100, 1, 10_000).weight() > 10_000 * 16);
    }
}

//! The Flux plugin, for runtimes with `mlPolicy.flux`: Flux Framework runs
//! as the workload manager inside the trainer's pods. An init container
//! copies a Flux install into a shared volume, a ConfigMap carries the
//! install script and the trainer's entrypoint (which starts one Flux broker
//! per pod and runs the trainer's command under `flux run` on the first),
//! and a Secret carries the CURVE certificate the brokers authenticate with.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, EmptyDirVolumeSource, Secret, SecretVolumeSource,
    Volume as K8sVolume,
};
use trainhub_plugin_sdk::info;
use trainhub_plugin_sdk::prelude::*;

use crate::common::{
    gpus, job_name, ml_policy, mount, owned_metadata, resources_per_node, set_trainer_count,
    to_json, trainer_count, trainer_node, upsert_mount, upsert_trainer_env, upsert_volume,
};

/// The Flux plugin.
#[derive(Default)]
pub struct Flux;

/// Mode of the scripts in the ConfigMap volume (`0755`).
const SCRIPTS_MODE: i32 = 0o755;
/// Mode of the certificate in the Secret volume (`0400`).
const CURVE_MODE: i32 = 0o400;
/// Where the Flux view images keep their Flux install.
const VIEW_ROOT: &str = "/opt/view";

impl Plugin for Flux {
    fn describe(&self) -> Descriptor {
        Descriptor::new("flux", env!("CARGO_PKG_VERSION"))
            .frameworks(["flux"])
            .validates()
            .enforces_ml_policy()
            .builds()
    }

    /// As upstream: the runtime's `node` job may not have an init container
    /// named `flux-installer`, which the plugin adds.
    fn validate(&self, _: &Ctx, job: &TrainJob, runtime: &Runtime) -> Validation {
        let mut validation = Validation::default();
        if runtime
            .spec()
            .ml_policy
            .as_ref()
            .is_none_or(|p| p.flux.is_none())
        {
            return validation;
        }
        // A runtime the info cannot be made from is reported by the JobSet plugin.
        let Ok(info) = info::new_runtime_info(job, runtime) else {
            return validation;
        };
        let reserved = info
            .pod_sets
            .iter()
            .filter(|set| set.name == constants::NODE)
            .flat_map(|set| &set.init_containers)
            .filter(|c| c.name == constants::FLUX_INSTALLER_CONTAINER_NAME);
        for container in reserved {
            validation.error(FieldError::invalid(
                "spec.trainer.initContainers",
                Some(container.name.clone()),
                format!(
                    "InitContainer '{}' is reserved",
                    constants::FLUX_INSTALLER_CONTAINER_NAME
                ),
            ));
        }
        validation
    }

    /// What upstream's plainml plugin does for every runtime, Flux's
    /// included (the trainer's count from `trainer.numNodes`, the TrainJob's
    /// env on the trainer's `node` container); then the trainer's command
    /// wrapped in the Flux entrypoint, and on the `node` job the installer
    /// init container, the shared volumes and their mounts on its `node`
    /// container.
    fn enforce_ml_policy(
        &self,
        _: &Ctx,
        info: &mut RuntimeInfo,
        job: &TrainJob,
    ) -> Result<(), Failure> {
        if ml_policy(info)?.flux.is_none() {
            return Ok(());
        }
        set_trainer_count(info, job);
        if let Some(node) = trainer_node(info, job) {
            upsert_trainer_env(node, job);
        }
        let settings = BrokerSettings::of(info, job);
        let config_map = config_map_name(job);

        if let Ok(trainer) = info.trainer_mut()
            && let Some(node) = trainer.container_mut(constants::NODE)
        {
            wrap_command(node, job);
        }

        let installer = Container {
            image: Some(settings.view_image),
            command: Some(vec![
                "/bin/bash".to_string(),
                format!(
                    "{}/{}",
                    constants::FLUX_CONFIG_DIR,
                    constants::FLUX_INIT_KEY
                ),
            ]),
            volume_mounts: vec![
                mount(
                    constants::FLUX_INSTALL_VOLUME_NAME,
                    constants::FLUX_VOLUME_PATH,
                    None,
                ),
                mount(&config_map, constants::FLUX_CONFIG_DIR, Some(true)),
            ],
            ..Container::new(constants::FLUX_INSTALLER_CONTAINER_NAME)
        };
        let volumes = volumes(job);
        let mounts = [
            mount(
                constants::FLUX_INSTALL_VOLUME_NAME,
                constants::FLUX_VOLUME_PATH,
                None,
            ),
            mount(
                constants::FLUX_SPACK_VIEW_VOLUME_NAME,
                constants::FLUX_SPACK_VIEW_VOLUME_PATH,
                None,
            ),
            mount(&config_map, constants::FLUX_CONFIG_DIR, Some(true)),
            mount(
                constants::FLUX_CURVE_VOLUME_NAME,
                constants::FLUX_CURVE_VOLUME_PATH,
                Some(true),
            ),
            mount(
                constants::FLUX_MEMORY_VOLUME_NAME,
                constants::FLUX_MEMORY_VOLUME_PATH,
                Some(true),
            ),
        ];
        for set in info
            .pod_sets
            .iter_mut()
            .filter(|set| set.name == constants::NODE)
        {
            for volume in &volumes {
                upsert_volume(set, info::volume_record(volume));
            }
            match set
                .init_containers
                .iter_mut()
                .find(|c| c.name == installer.name)
            {
                Some(existing) => *existing = installer.clone(),
                None => set.init_containers.push(installer.clone()),
            }
            for node in set
                .containers
                .iter_mut()
                .filter(|c| c.name == constants::NODE)
            {
                for m in &mounts {
                    upsert_mount(node, m.clone());
                }
            }
        }
        info::refresh_endpoints(info, job)
    }

    /// The ConfigMap `J-flux-entrypoint` (`init.sh` for the installer, with
    /// the broker configuration; `entrypoint.sh` for the trainer) and the
    /// immutable Secret `J-flux-curve` (`curve.cert`, a fresh CURVE key pair
    /// from the host's entropy; a spoke creates it once and keeps it).
    fn build(
        &self,
        _: &Ctx,
        info: &RuntimeInfo,
        job: &TrainJob,
        _: &Target,
    ) -> Result<Vec<Value>, Failure> {
        let Some(mut flux) = ml_policy(info)?.flux else {
            return Ok(Vec::new());
        };
        flux.default_fields();
        let settings = BrokerSettings::of(info, job);
        let nodes = i64::from(trainer_count(info));
        let tasks = i64::from(
            job.spec
                .trainer
                .as_ref()
                .and_then(|t| t.num_proc_per_node)
                .or(flux.num_proc_per_node)
                .unwrap_or(1),
        );
        let (requests, limits) = resources_per_node(info, job);
        let gpus = gpus(&requests, &limits)?;
        let name = job_name(job);

        let config_map = ConfigMap {
            metadata: owned_metadata(job, config_map_name(job)),
            data: Some(BTreeMap::from([
                (
                    constants::FLUX_ENTRYPOINT_KEY.to_string(),
                    entrypoint_script(name, nodes, tasks, gpus),
                ),
                (
                    constants::FLUX_INIT_KEY.to_string(),
                    init_script(job, nodes, &settings),
                ),
            ])),
            ..Default::default()
        };
        let secret = Secret {
            metadata: owned_metadata(
                job,
                format!("{name}{}", constants::FLUX_CURVE_SECRET_SUFFIX),
            ),
            immutable: Some(true),
            data: Some(BTreeMap::from([(
                constants::FLUX_CURVE_CERT_KEY.to_string(),
                ByteString(
                    curve_certificate(name, trainhub_plugin_sdk::random_bytes)?.into_bytes(),
                ),
            )])),
            ..Default::default()
        };
        Ok(vec![
            to_json("Flux ConfigMap", &config_map)?,
            to_json("CURVE Secret", &secret)?,
        ])
    }
}

/// The broker settings a runtime or TrainJob may set through the trainer's
/// env: the defaults, then the literal values on the trainer's `node`
/// container, then the TrainJob's `spec.trainer.env` (an entry without a
/// literal value counts as empty there, as upstream reads it).
struct BrokerSettings {
    view_image: String,
    network_device: String,
    queue_policy: String,
}

impl BrokerSettings {
    fn of(info: &RuntimeInfo, job: &TrainJob) -> Self {
        let mut settings = BrokerSettings {
            view_image: constants::FLUX_INSTALLER_IMAGE.to_string(),
            network_device: constants::FLUX_NETWORK_DEVICE.to_string(),
            queue_policy: constants::FLUX_QUEUE_POLICY.to_string(),
        };
        let runtime_env = info
            .trainer()
            .ok()
            .and_then(|t| t.container(constants::NODE))
            .into_iter()
            .flat_map(|c| &c.env)
            .filter_map(|var| Some((var.name.as_str(), var.value.as_deref()?)));
        let job_env = job
            .spec
            .trainer
            .iter()
            .flat_map(|t| t.env.iter().flatten())
            .map(|var| (var.name.as_str(), var.value.as_deref().unwrap_or_default()));
        for (name, value) in runtime_env.chain(job_env) {
            let slot = match name {
                constants::FLUX_ENV_VIEW_IMAGE => &mut settings.view_image,
                constants::FLUX_ENV_NETWORK_DEVICE => &mut settings.network_device,
                constants::FLUX_ENV_QUEUE_POLICY => &mut settings.queue_policy,
                _ => continue,
            };
            *slot = value.to_string();
        }
        settings
    }
}

fn config_map_name(job: &TrainJob) -> String {
    format!("{}{}", job_name(job), constants::FLUX_CONFIGMAP_SUFFIX)
}

/// The trainer's command handed to the Flux entrypoint as one word: the
/// command the container would run (the TrainJob's, else the runtime's) and
/// the TrainJob's args, joined by spaces. Only the TrainJob's args move into
/// it: the container keeps the runtime's args, which follow as further words
/// (upstream clears the TrainJob's args and its JobSet builder then leaves
/// the runtime's in place).
fn wrap_command(node: &mut Container, job: &TrainJob) {
    let job_args = job.spec.trainer.as_ref().and_then(|t| t.args.as_ref());
    let words: Vec<&str> = node
        .command
        .iter()
        .flatten()
        .chain(job_args.into_iter().flatten())
        .map(String::as_str)
        .collect();
    let original = words.join(" ").trim().to_string();
    node.command = Some(vec![
        "/bin/bash".to_string(),
        format!(
            "{}/{}",
            constants::FLUX_CONFIG_DIR,
            constants::FLUX_ENTRYPOINT_KEY
        ),
        original,
    ]);
    if job_args.is_some() {
        // The runtime's args, which the JobSet template still holds.
        node.args = None;
    }
}

/// The `node` job's volumes, in upstream's order: the Spack software tree,
/// the Flux install, the scripts, shared memory and the certificate.
fn volumes(job: &TrainJob) -> Vec<K8sVolume> {
    let empty_dir = |name: &str, medium: Option<&str>| K8sVolume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    };
    let config_map = config_map_name(job);
    vec![
        empty_dir(constants::FLUX_SPACK_VIEW_VOLUME_NAME, None),
        empty_dir(constants::FLUX_INSTALL_VOLUME_NAME, None),
        K8sVolume {
            name: config_map.clone(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map,
                default_mode: Some(SCRIPTS_MODE),
                ..Default::default()
            }),
            ..Default::default()
        },
        empty_dir(constants::FLUX_MEMORY_VOLUME_NAME, Some("Memory")),
        K8sVolume {
            name: constants::FLUX_CURVE_VOLUME_NAME.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(format!(
                    "{}{}",
                    job_name(job),
                    constants::FLUX_CURVE_SECRET_SUFFIX
                )),
                default_mode: Some(CURVE_MODE),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

/// `start` alone for one item, else `start-last`: Flux's idset notation.
/// `count` is at least 1 in practice; 0 gives `start--1`, as upstream.
pub fn id_range(count: i64, start: i64) -> String {
    if count == 1 {
        start.to_string()
    } else {
        format!("{start}-{}", start.saturating_add(count).saturating_sub(1))
    }
}

/// The trainer pods' host names as a Flux hostlist: `J-node-0-[0-(n-1)]`.
pub fn hostlist(job: &str, nodes: i64) -> String {
    format!("{job}-{}-0-[{}]", constants::NODE, id_range(nodes, 0))
}

/// A TOML basic string: quoted, with quotes, backslashes and control
/// characters escaped, so a value from the env cannot break the file.
fn toml_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The brokers' configuration (`broker.toml`): guests and root may own
/// jobs; the resource file and CURVE certificate under the shared install;
/// bootstrap over TCP on port 8050 through the JobSet's headless service
/// (`<pod>.J.<namespace>.svc.cluster.local`); a job archive; the queue
/// policy of Fluxion's queue manager.
fn broker_config(job: &TrainJob, nodes: i64, settings: &BrokerSettings) -> String {
    let name = job_name(job);
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    let config = format!("{}/config", constants::FLUX_VOLUME_PATH);
    let bind = format!("tcp://{}:%p", settings.network_device);
    let connect = format!("tcp://%h.{name}.{namespace}.svc.cluster.local:%p");
    [
        "[access]".to_string(),
        "allow-guest-user = true".to_string(),
        "allow-root-owner = true".to_string(),
        String::new(),
        "# R, the resource set, is written by the entrypoint with flux-R(1).".to_string(),
        "[resource]".to_string(),
        format!("path = \"{config}/etc/flux/system/R\""),
        String::new(),
        "[bootstrap]".to_string(),
        format!(
            "curve_cert = \"{config}/etc/curve/{}\"",
            constants::FLUX_CURVE_CERT_KEY
        ),
        "default_port = 8050".to_string(),
        format!("default_bind = {}", toml_string(&bind)),
        format!("default_connect = {}", toml_string(&connect)),
        format!(
            "hosts = [{{ host = {} }}]",
            toml_string(&hostlist(name, nodes))
        ),
        String::new(),
        "[archive]".to_string(),
        format!("dbpath = \"{config}/var/lib/flux/job-archive.sqlite\""),
        "period = \"1m\"".to_string(),
        "busytimeout = \"50s\"".to_string(),
        String::new(),
        "[sched-fluxion-qmanager]".to_string(),
        format!("queue-policy = {}", toml_string(&settings.queue_policy)),
    ]
    .join("\n")
}

/// The installer's script: lays out the configuration tree under
/// `/mnt/flux/config` (hostlist, broker configuration, run and state
/// directories), then copies the image's Spack view and `/opt/software`
/// into the shared volume.
fn init_script(job: &TrainJob, nodes: i64, settings: &BrokerSettings) -> String {
    let name = job_name(job);
    let broker = broker_config(job, nodes, settings);
    let hosts = hostlist(name, nodes);
    let base = constants::FLUX_VOLUME_PATH;
    format!(
        r#"#!/bin/bash
# Flux installer for TrainJob {name}: runs in the flux-installer init container
# of every node pod, before the trainer starts.
fluxroot={VIEW_ROOT}
mainHost={name}-0
installRoot={base}/config
export fluxroot
export PATH={VIEW_ROOT}/bin:$PATH
echo "$(hostname): preparing Flux from ${{fluxroot}} into ${{installRoot}}"

mkdir -p "${{fluxroot}}/bin"
mkdir -p "${{installRoot}}/etc/flux/system/cron.d" "${{installRoot}}/var/lib/flux"
mkdir -p "${{installRoot}}/etc/flux/config" "${{installRoot}}/run/flux" "${{installRoot}}/etc/curve"

# Every broker reads the same hostlist; the trainer's entrypoint turns it into R.
echo "{hosts}" > "${{installRoot}}/etc/flux/system/hostlist"

cat > "${{installRoot}}/etc/flux/config/broker.toml" <<'BROKER_TOML'
{broker}
BROKER_TOML
echo "Broker configuration:"
cat "${{installRoot}}/etc/flux/config/broker.toml"

# /opt/view links into the Spack view, which also links to /opt/software:
# both trees go to the shared volume, the trainer restores /opt/software.
viewroot={base}
mkdir -p "${{viewroot}}/view"
view="/opt/views/._view/$(ls /opt/views/._view/)"
echo "Copying ${{view}} and /opt/software to ${{viewroot}}"
cp -R "${{view}}"/* "${{viewroot}}/view"
cp -R /opt/software "${{viewroot}}/"

touch "${{viewroot}}/flux-operator-done.txt"
echo "Flux is installed."
"#
    )
}

/// The trainer's entrypoint: puts the shared Flux view on the path, restores
/// `/opt/software`, installs the CURVE certificate, writes R for the hosts
/// (`--cores` per task, `--gpu` when the nodes have GPUs), then starts a
/// broker. The first pod (`J-node-0-0`) runs the command given as arguments
/// with `flux run -N <nodes> -n <nodes×tasks> [-g <gpus>]`, or an interactive
/// broker without one; the others start follower brokers until one exits
/// cleanly, retrying every 15 s.
fn entrypoint_script(name: &str, nodes: i64, tasks: i64, gpus: i128) -> String {
    let main_host = format!("{name}-{}-0-0", constants::NODE);
    let mut flags = format!("-N {nodes} -n {}", tasks.saturating_mul(nodes));
    let mut resources = format!("--cores={}", id_range(tasks, 0));
    if gpus > 0 {
        flags.push_str(&format!(" -g {gpus}"));
        let gpus = i64::try_from(gpus).unwrap_or(i64::MAX);
        resources.push_str(&format!(" --gpu={}", id_range(gpus, 0)));
    }
    let base = constants::FLUX_VOLUME_PATH;
    let curve = format!(
        "{}/{}",
        constants::FLUX_CURVE_VOLUME_PATH,
        constants::FLUX_CURVE_CERT_KEY
    );
    let software = constants::FLUX_SPACK_VIEW_VOLUME_PATH;
    format!(
        r#"#!/bin/bash
# Flux entrypoint for TrainJob {name}: every node pod runs one Flux broker;
# {main_host} runs the trainer's command (the arguments) under flux run.
fluxuser=$(whoami)
fluxuid=$(id -u "${{fluxuser}}")

viewbase={base}
viewroot=${{viewbase}}/view
configroot=${{viewbase}}/config
viewbin=${{viewroot}}/bin
# Appended, so that the container's own tools (Python) come first.
export PATH=$PATH:${{viewbin}}

# The view's binaries link into /opt/software, which the installer saved.
cp -R ${{viewbase}}/software/* {software}/

# Flux's own Python: its site-packages on PYTHONPATH, its binary as python.
foundroot=$(find "${{viewroot}}" -maxdepth 2 -type d -path "${{viewroot}}/lib/python3*" 2>/dev/null)
pythonversion=${{viewroot}}/bin/$(basename "${{foundroot}}")
echo "Flux Python: ${{pythonversion}} (${{foundroot}})"
if [[ -f "${{pythonversion}}" ]]; then
    rm -rf "${{viewroot}}/bin/python3" "${{viewroot}}/bin/python"
    ln -s "${{pythonversion}}" "${{viewroot}}/lib/python" || true
    ln -s "${{pythonversion}}" "${{viewroot}}/lib/python3" || true
fi
export PYTHONPATH=${{PYTHONPATH:-""}}:${{foundroot}}/site-packages
export FLUX_RC_EXTRA=${{viewroot}}/etc/flux/rc1.d

# Helpers for interactive use: switch to Fluxion, and the view's environment.
printf '%s\n' \
    "flux module remove sched-simple" \
    "flux module load sched-fluxion-resource" \
    "flux module load sched-fluxion-qmanager" > ${{viewbase}}/load-fluxion.sh
cat > ${{viewbase}}/flux-view.sh <<VIEW_ENV
#!/bin/bash
export PATH=$PATH
export PYTHONPATH=$PYTHONPATH
export LD_LIBRARY_PATH=${{LD_LIBRARY_PATH:-""}}:${{viewroot}}/lib
export fluxsocket=local://${{configroot}}/run/flux/local
VIEW_ENV

cfg=${{configroot}}/etc/flux/config
command="$@"

# The certificate, readable by its owner only.
curvepath=${{configroot}}/etc/curve/{cert}
cp {curve} "${{curvepath}}"
chmod go-r "${{curvepath}}"
chown -R "${{fluxuid}}" "${{curvepath}}"

# R: the resources of every host.
hosts=$(cat ${{configroot}}/etc/flux/system/hostlist)
flux R encode --hosts="${{hosts}}" {resources} > /tmp/R
mv /tmp/R ${{configroot}}/etc/flux/system/R

export STATE_DIR=${{configroot}}/var/lib/flux
export FLUX_OUTPUT_DIR=/tmp/fluxout
mkdir -p "${{STATE_DIR}}" "${{FLUX_OUTPUT_DIR}}" ${{configroot}}/etc/flux/system/cron.d

mainHost="{main_host}"
brokerOptions="-Scron.directory=${{configroot}}/etc/flux/system/cron.d -Stbon.fanout=256 -Srundir=${{configroot}}/run/flux -Sstatedir=${{STATE_DIR}} -Slocal-uri=local://${{configroot}}/run/flux/local -Slog-stderr-level=0 -Slog-stderr-mode=local"

if [ "$(hostname)" = "${{mainHost}}" ]; then
    echo "Command: ${{command}}"
    if [ -z "${{command}}" ]; then
        # No command: an interactive cluster.
        echo "flux broker --config-path ${{cfg}} ${{brokerOptions}}"
        flux broker --config-path ${{cfg}} ${{brokerOptions}}
    else
        flags="{flags}"
        echo "flux start -o --config ${{cfg}} ${{brokerOptions}} flux run ${{flags}} ${{command}}"
        flux start -o --config ${{cfg}} ${{brokerOptions}} flux run ${{flags}} ${{command}}
    fi
else
    # Followers join the lead broker, retrying until one run exits cleanly.
    until flux start -o --config ${{cfg}} ${{brokerOptions}}; do
        echo "Flux follower broker exited with $?; retrying in 15s"
        sleep 15
    done
    echo "Flux follower broker exited cleanly."
fi

touch ${{viewbase}}/flux-operator-complete.txt
"#,
        cert = constants::FLUX_CURVE_CERT_KEY,
    )
}

/// Z85 (ZeroMQ RFC 32) of `data`, whose length must be a multiple of 4.
pub fn z85(data: &[u8]) -> Option<String> {
    const ALPHABET: &[u8; 85] =
        b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    if !data.len().is_multiple_of(4) {
        return None;
    }
    let mut out = String::with_capacity(data.len() / 4 * 5);
    for chunk in data.chunks_exact(4) {
        let mut value = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let mut digits = [0u8; 5];
        for digit in digits.iter_mut().rev() {
            *digit = ALPHABET[(value % 85) as usize];
            value /= 85;
        }
        out.extend(digits.iter().map(|&d| char::from(d)));
    }
    Some(out)
}

/// A ZeroMQ CURVE secret certificate (the `flux keygen` layout: a
/// `metadata` section with the name, a `curve` section with both keys in
/// Z85) for an X25519 key pair made from 32 bytes of `entropy`.
pub fn curve_certificate(
    name: &str,
    entropy: impl FnOnce(u32) -> Vec<u8>,
) -> Result<String, Failure> {
    let bytes: [u8; 32] = entropy(32)
        .try_into()
        .map_err(|_| Failure::new("the host gave too few random bytes for the CURVE key"))?;
    let secret = x25519_dalek::StaticSecret::from(bytes);
    let public = x25519_dalek::PublicKey::from(&secret);
    let encode = |key: &[u8; 32]| z85(key).ok_or_else(|| Failure::new("Z85 of a 32-byte key"));
    Ok(format!(
        "#   ZeroMQ CURVE secret certificate of TrainJob {name}'s Flux brokers\n\
         #   (written by trainhub's flux plugin)\n\
         \n\
         metadata\n    name = \"{name}\"\n\
         curve\n    public-key = \"{}\"\n    secret-key = \"{}\"\n",
        encode(public.as_bytes())?,
        encode(&secret.to_bytes())?,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn z85_matches_the_rfc_example_and_refuses_odd_lengths() {
        let hello = [0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B];
        assert_eq!(z85(&hello).as_deref(), Some("HelloWorld"));
        assert_eq!(z85(&[0; 4]).as_deref(), Some("00000"));
        assert_eq!(z85(&[1, 2, 3]), None);
    }

    #[test]
    fn the_certificate_holds_the_x25519_public_key_of_its_secret_key() {
        // RFC 7748 section 6.1, Alice's key pair.
        let hex = |text: &str| -> Vec<u8> {
            (0..text.len() / 2)
                .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        };
        let secret = hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public = hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        let cert = curve_certificate("job", |_| secret.clone()).unwrap();
        assert!(cert.contains("metadata\n    name = \"job\"\ncurve\n"));
        assert!(cert.contains(&format!("    public-key = \"{}\"\n", z85(&public).unwrap())));
        assert!(cert.contains(&format!("    secret-key = \"{}\"\n", z85(&secret).unwrap())));
        assert!(curve_certificate("job", |_| vec![0; 31]).is_err());
    }

    #[test]
    fn ranges_and_hostlists_use_flux_idsets() {
        assert_eq!(id_range(1, 0), "0");
        assert_eq!(id_range(4, 0), "0-3");
        assert_eq!(id_range(3, 10), "10-12");
        assert_eq!(hostlist("lammps", 1), "lammps-node-0-[0]");
        assert_eq!(hostlist("flux", 4), "flux-node-0-[0-3]");
    }

    #[test]
    fn toml_strings_cannot_break_out() {
        assert_eq!(toml_string("eth0"), "\"eth0\"");
        assert_eq!(toml_string("a\"b\\\nc"), "\"a\\\"b\\\\\\nc\"");
    }
}

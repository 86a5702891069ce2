//! Endpoints on one machine: pod DNS names become `127.0.0.1`, declared
//! container ports become the run's own free local ports.

use std::collections::BTreeMap;

/// The loopback address every pod of a run answers on.
pub const LOCAL_IP: &str = "127.0.0.1";

/// The host names of one run and its port map, applied to env values, args
/// and ConfigMap data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints {
    /// Every DNS form of every pod of the run, longest first.
    hosts: Vec<String>,
    /// Declared `containerPort` → the local port this attempt uses.
    ports: BTreeMap<String, String>,
}

impl Endpoints {
    /// `hostnames` are the pods' host names (`<jobset>-<rjob>-<job>-<pod>`);
    /// each also gets its `.<subdomain>`, `.<subdomain>.<ns>`,
    /// `.<subdomain>.<ns>.svc` and `.<subdomain>.<ns>.svc.cluster.local` forms.
    pub fn new<'a>(
        hostnames: impl IntoIterator<Item = &'a str>,
        subdomain: &str,
        namespace: &str,
        ports: &BTreeMap<i32, u16>,
    ) -> Self {
        let mut hosts = Vec::new();
        for host in hostnames {
            hosts.push(host.to_owned());
            let fqdn = format!("{host}.{subdomain}");
            hosts.push(format!("{fqdn}.{namespace}.svc.cluster.local"));
            hosts.push(format!("{fqdn}.{namespace}.svc"));
            hosts.push(format!("{fqdn}.{namespace}"));
            hosts.push(fqdn);
        }
        hosts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        hosts.dedup();
        Self {
            hosts,
            ports: ports
                .iter()
                .map(|(declared, local)| (declared.to_string(), local.to_string()))
                .collect(),
        }
    }

    /// The local port standing in for a declared container port.
    pub fn local_port(&self, declared: &str) -> Option<&str> {
        self.ports.get(declared).map(String::as_str)
    }

    /// Rewrites one env value or arg: a value that is a declared port (or
    /// ends in `=<port>`) takes the local port; otherwise see [`Self::rewrite_text`].
    pub fn rewrite_value(&self, value: &str) -> String {
        if let Some(local) = self.local_port(value) {
            return local.to_owned();
        }
        if let Some((head, tail)) = value.rsplit_once('=')
            && let Some(local) = self.local_port(tail)
        {
            return format!("{}={local}", self.rewrite_text(head));
        }
        self.rewrite_text(value)
    }

    /// Replaces every pod host name of the run that stands as a whole name
    /// (not inside a longer name) by `127.0.0.1`, and a declared port right
    /// after it (`host:29500`) by the local port.
    pub fn rewrite_text(&self, text: &str) -> String {
        if self.hosts.is_empty() {
            return text.to_owned();
        }
        let bytes = text.as_bytes();
        let mut out = String::with_capacity(text.len());
        let mut i = 0;
        let mut copied = 0;
        while i < bytes.len() {
            let starts_name = i == 0 || !is_name_byte(bytes[i - 1]);
            let matched = if starts_name {
                self.hosts
                    .iter()
                    .find(|h| text[i..].starts_with(h.as_str()) && ends_name(bytes, i + h.len()))
            } else {
                None
            };
            let Some(host) = matched else {
                i += 1;
                continue;
            };
            out.push_str(&text[copied..i]);
            out.push_str(LOCAL_IP);
            i += host.len();
            copied = i;
            if bytes.get(i) == Some(&b':') {
                let digits = text[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
                if let Some(local) = self.local_port(&text[i + 1..i + 1 + digits]) {
                    out.push(':');
                    out.push_str(local);
                    i += 1 + digits;
                    copied = i;
                }
            }
        }
        out.push_str(&text[copied..]);
        out
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'
}

/// A name ends at `end` unless a longer name continues there (`-`, an
/// alphanumeric, or a dot followed by another label).
fn ends_name(bytes: &[u8], end: usize) -> bool {
    match bytes.get(end) {
        None => true,
        Some(b'.') => !bytes
            .get(end + 1)
            .is_some_and(|b| b.is_ascii_alphanumeric()),
        Some(&b) => !(b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints() -> Endpoints {
        let names: Vec<String> = (0..12).map(|i| format!("j-node-0-{i}")).collect();
        Endpoints::new(
            names.iter().map(String::as_str),
            "j",
            "team",
            &[(29500, 40001)].into(),
        )
    }

    #[test]
    fn host_names_in_every_form_become_loopback() {
        let e = endpoints();
        for text in [
            "j-node-0-0",
            "j-node-0-0.j",
            "j-node-0-0.j.team",
            "j-node-0-0.j.team.svc",
            "j-node-0-0.j.team.svc.cluster.local",
        ] {
            assert_eq!(e.rewrite_text(text), "127.0.0.1", "{text}");
        }
        assert_eq!(
            e.rewrite_text("tcp://j-node-0-1.j:29500/x j-node-0-11.j:22"),
            "tcp://127.0.0.1:40001/x 127.0.0.1:22"
        );
        assert_eq!(e.rewrite_text("end j-node-0-2."), "end 127.0.0.1.");
    }

    #[test]
    fn longer_or_foreign_names_are_left_alone() {
        let e = endpoints();
        for text in [
            "j-node-0-12",
            "xj-node-0-0",
            "j-node-0-0.other",
            "j-node-0-0.j.otherns",
            "j-node-0-0-x",
        ] {
            assert_eq!(e.rewrite_text(text), text);
        }
    }

    #[test]
    fn port_values_take_the_local_port() {
        let e = endpoints();
        assert_eq!(e.rewrite_value("29500"), "40001");
        assert_eq!(
            e.rewrite_value("--master_port=29500"),
            "--master_port=40001"
        );
        assert_eq!(
            e.rewrite_value("--rdzv=j-node-0-0.j=29500"),
            "--rdzv=127.0.0.1=40001"
        );
        assert_eq!(e.rewrite_value("295001"), "295001");
        assert_eq!(e.rewrite_value("j-node-0-0.j:29500"), "127.0.0.1:40001");
        assert_eq!(e.rewrite_value("2"), "2");
    }
}

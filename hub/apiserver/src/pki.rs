//! A small certificate authority: ECDSA P-256 keys, a CA valid for ten
//! years, server and client certificates valid for one year.
//!
//! Client certificates carry the user in Subject CN and the groups in Subject
//! O, one O attribute per group, as Kubernetes reads them (see
//! [`crate::auth::Authenticator`]). rcgen keeps one value per attribute type,
//! so the subject of every leaf is written here and the leaf re-signed.
//!
//! [`PemDir`] keeps a CA and the certificates it issued as PEM files in one
//! directory: `ca.crt`, `ca.key`, `NAME.crt`, `NAME.key`; keys are 0600.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType, SigningKey,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::{FromDer, X509Certificate};

/// How long a generated CA is valid.
pub const CA_VALIDITY_DAYS: i64 = 3650;
/// How long an issued server or client certificate is valid.
pub const LEAF_VALIDITY_DAYS: i64 = 365;
/// Certificates start this long in the past, for clocks that lag.
const BACKDATE: Duration = Duration::hours(1);

/// Why a certificate could not be made, loaded or stored.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error("generating {what}: {source}")]
    Generate {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

fn invalid(what: impl Into<String>, message: impl fmt::Display) -> PkiError {
    PkiError::Invalid {
        what: what.into(),
        message: message.to_string(),
    }
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A CA certificate and key that issue server and client certificates.
pub struct Ca {
    cert_pem: String,
    cert_der: Vec<u8>,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

fn new_key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|source| PkiError::Generate { what, source })
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::days(days);
}

fn require_name(what: &str, value: &str) -> Result<(), PkiError> {
    if value.is_empty() {
        return Err(invalid(what, "must not be empty"));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(
            what,
            format!("{value:?} contains control characters"),
        ));
    }
    Ok(())
}

impl Ca {
    /// A new self-signed CA named `common_name`, valid for
    /// [`CA_VALIDITY_DAYS`], that may sign leaves only (path length 0).
    pub fn generate(common_name: &str) -> Result<Ca, PkiError> {
        require_name("CA common name", common_name)?;
        let key = new_key("CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, CA_VALIDITY_DAYS);
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::Generate {
                what: "CA certificate",
                source,
            })?;
        Ok(Ca {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from PEM text: the first certificate of `cert_pem` must be a CA
    /// certificate and `key_pem` (PKCS#8) its private key.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Ca, PkiError> {
        let cert_der = cert_der(cert_pem).map_err(|e| invalid("CA certificate", e))?;
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| invalid("CA key", format!("{e} (expected a PKCS#8 PEM private key)")))?;
        let (_, x509) = X509Certificate::from_der(&cert_der)
            .map_err(|e| invalid("CA certificate", format!("cannot parse: {e}")))?;
        if !x509.is_ca() {
            return Err(invalid(
                "CA certificate",
                "is not a CA (basicConstraints CA:TRUE missing)",
            ));
        }
        if x509.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(invalid("CA key", "does not belong to the CA certificate"));
        }
        let issuer = Issuer::from_ca_cert_der(&CertificateDer::from(cert_der.as_slice()), key)
            .map_err(|e| invalid("CA certificate", e))?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            cert_der,
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA's private key, for saving it ([`PemDir::write_ca`]).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A server certificate (EKU serverAuth) for `dns_names` and `ips`; at
    /// least one is required, since TLS clients match only the SANs. Valid
    /// for [`LEAF_VALIDITY_DAYS`].
    pub fn issue_server(
        &self,
        common_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<Issued, PkiError> {
        self.issue_server_for(common_name, dns_names, ips, LEAF_VALIDITY_DAYS)
    }

    /// [`Ca::issue_server`], valid for `days` (at least 1).
    pub fn issue_server_for(
        &self,
        common_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
        days: i64,
    ) -> Result<Issued, PkiError> {
        if dns_names.is_empty() && ips.is_empty() {
            return Err(invalid(
                "server certificate",
                "needs at least one DNS name or IP address",
            ));
        }
        let mut params = CertificateParams::default();
        for (i, name) in dns_names.iter().enumerate() {
            require_name(&format!("dnsNames[{i}]"), name)?;
            let ia5 = rcgen::string::Ia5String::try_from(*name)
                .map_err(|e| invalid(format!("dnsNames[{i}]"), format!("{name:?}: {e}")))?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(common_name, &[], params, days)
    }

    /// A client certificate (EKU clientAuth): user `common_name`, one
    /// Subject O per group in `organizations`. Valid for
    /// [`LEAF_VALIDITY_DAYS`].
    pub fn issue_client(
        &self,
        common_name: &str,
        organizations: &[&str],
    ) -> Result<Issued, PkiError> {
        self.issue_client_for(common_name, organizations, LEAF_VALIDITY_DAYS)
    }

    /// [`Ca::issue_client`], valid for `days` (at least 1).
    pub fn issue_client_for(
        &self,
        common_name: &str,
        organizations: &[&str],
        days: i64,
    ) -> Result<Issued, PkiError> {
        let mut params = CertificateParams::default();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(common_name, organizations, params, days)
    }

    /// Issues again what `cert_pem` (one of this CA's certificates) is:
    /// same subject, names and usage, with a new key, valid for `days`.
    pub fn renew(&self, cert_pem: &str, days: i64) -> Result<Issued, PkiError> {
        let info = CertInfo::from_pem(cert_pem).map_err(|e| invalid("certificate", e))?;
        let orgs: Vec<&str> = info.organizations.iter().map(String::as_str).collect();
        if info.server {
            let dns: Vec<&str> = info.dns_names.iter().map(String::as_str).collect();
            self.issue_server_for(&info.common_name, &dns, &info.ips, days)
        } else {
            self.issue_client_for(&info.common_name, &orgs, days)
        }
    }

    fn issue(
        &self,
        common_name: &str,
        organizations: &[&str],
        mut params: CertificateParams,
        days: i64,
    ) -> Result<Issued, PkiError> {
        if days < 1 {
            return Err(invalid(
                "validity",
                format!("{days} days: must be at least 1"),
            ));
        }
        require_name("common name", common_name)?;
        for (i, o) in organizations.iter().enumerate() {
            require_name(&format!("organizations[{i}]"), o)?;
        }
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, days);
        let key = new_key("certificate key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| PkiError::Generate {
                what: "certificate",
                source,
            })?;
        let subject = subject_der(common_name, organizations);
        let der = with_subject(cert.der(), &subject, self.issuer.key())?;
        Ok(Issued {
            cert_pem: pem_encode("CERTIFICATE", &der),
            key_pem: key.serialize_pem(),
        })
    }
}

/// What a certificate says of itself: serial, validity, subject and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The serial number, lowercase hexadecimal without leading zeros.
    pub serial: String,
    /// Validity, in seconds since the Unix epoch.
    pub not_before: i64,
    pub not_after: i64,
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// Whether it is a server certificate (EKU serverAuth).
    pub server: bool,
}

impl CertInfo {
    /// Reads a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<CertInfo, String> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
        let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
            attr.as_str().ok().map(str::to_string)
        };
        let mut dns_names = Vec::new();
        let mut ips = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(d) => {
                        dns_names.push(d.to_string())
                    }
                    x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                        4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                        16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
        let server = cert
            .extended_key_usage()
            .ok()
            .flatten()
            .is_some_and(|eku| eku.value.server_auth);
        let serial = hex::encode(cert.raw_serial());
        let serial = serial.trim_start_matches('0');
        Ok(CertInfo {
            serial: if serial.is_empty() {
                "0".into()
            } else {
                serial.into()
            },
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            common_name: cert
                .subject()
                .iter_common_name()
                .next()
                .and_then(text)
                .unwrap_or_default(),
            organizations: cert
                .subject()
                .iter_organization()
                .filter_map(text)
                .collect(),
            dns_names,
            ips,
            server,
        })
    }

    /// Reads the first certificate of a PEM text.
    pub fn from_pem(pem: &str) -> Result<CertInfo, String> {
        Self::from_der(&cert_der(pem)?)
    }
}

/// The DER of the first `CERTIFICATE` in `pem`.
pub fn cert_der(pem: &str) -> Result<Vec<u8>, String> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|c| c.to_vec())
        .map_err(|e| format!("no PEM CERTIFICATE found: {e}"))
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

// ---- DER surgery: replace a certificate's subject and re-sign it. ----

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const UTF8_STRING: u8 = 0x0c;
const BIT_STRING: u8 = 0x03;
/// 2.5.4.3 and 2.5.4.10.
const OID_COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
const OID_ORGANIZATION: [u8; 3] = [0x55, 0x04, 0x0a];

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// One DER element split off the front of a byte string.
struct Tlv<'a> {
    content: &'a [u8],
    /// Header and content.
    whole: &'a [u8],
    /// What follows the element.
    rest: &'a [u8],
}

/// Splits one DER element (single-byte tag) off `input`.
fn split_tlv(input: &[u8]) -> Option<Tlv<'_>> {
    let first = *input.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let len = input
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    let end = header.checked_add(len)?;
    let whole = input.get(..end)?;
    Some(Tlv {
        content: whole.get(header..)?,
        whole,
        rest: input.get(end..)?,
    })
}

/// `O=org…, CN=name`, one RDN per attribute, UTF8String values.
fn subject_der(common_name: &str, organizations: &[&str]) -> Vec<u8> {
    let rdn = |oid: &[u8], value: &str| {
        let mut atv = tlv(OID, oid);
        atv.extend(tlv(UTF8_STRING, value.as_bytes()));
        tlv(SET, &tlv(SEQUENCE, &atv))
    };
    let mut rdns = Vec::new();
    for o in organizations {
        rdns.extend(rdn(&OID_ORGANIZATION, o));
    }
    rdns.extend(rdn(&OID_COMMON_NAME, common_name));
    tlv(SEQUENCE, &rdns)
}

/// `cert` with its TBS subject replaced by `subject`, re-signed by `key`.
fn with_subject(cert: &[u8], subject: &[u8], key: &KeyPair) -> Result<Vec<u8>, PkiError> {
    let malformed = || invalid("certificate", "rcgen produced DER this code cannot edit");
    let outer = split_tlv(cert).ok_or_else(malformed)?.content;
    let tbs = split_tlv(outer).ok_or_else(malformed)?;
    let signature_algorithm = split_tlv(tbs.rest).ok_or_else(malformed)?.whole;
    let tbs = tbs.content;
    // version [0], serialNumber, signature, issuer, validity, subject, …
    let mut rest = tbs;
    let mut new_tbs = Vec::with_capacity(tbs.len() + subject.len());
    let mut elements = 0;
    for index in 0.. {
        let Some(element) = split_tlv(rest) else {
            break;
        };
        if index == 5 {
            new_tbs.extend_from_slice(subject);
        } else {
            new_tbs.extend_from_slice(element.whole);
        }
        rest = element.rest;
        elements += 1;
    }
    if !rest.is_empty() || elements < 7 {
        return Err(malformed());
    }
    let new_tbs = tlv(SEQUENCE, &new_tbs);
    let signature = key.sign(&new_tbs).map_err(|source| PkiError::Generate {
        what: "certificate signature",
        source,
    })?;
    let mut bits = vec![0u8];
    bits.extend(signature);
    let mut body = new_tbs;
    body.extend_from_slice(signature_algorithm);
    body.extend(tlv(BIT_STRING, &bits));
    Ok(tlv(SEQUENCE, &body))
}

// ---- Files. ----

/// Writes `contents` to `path` atomically (a temporary file in the same
/// directory, synced, then renamed over `path`) with permissions `mode`
/// on Unix. Safe to repeat; a crash leaves the old file or the new one.
pub fn write_file_atomically(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        file_name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    let written = (|| {
        let mut file = options.open(&tmp)?;
        #[cfg(unix)]
        {
            // The umask may have narrowed or (for a wide umask) not; be exact.
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        #[cfg(not(unix))]
        let _ = mode;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// A directory of PEM files: `ca.crt`/`ca.key` and `NAME.crt`/`NAME.key`.
/// Certificates are written 0644, keys 0600, the directory 0700 (made so
/// when created here, and narrowed to it when others could enter it).
#[derive(Debug, Clone)]
pub struct PemDir {
    path: PathBuf,
}

/// The name [`PemDir`] stores the CA under.
pub const CA_NAME: &str = "ca";

impl PemDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        PemDir { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `DIR/NAME.crt`.
    pub fn cert_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.crt"))
    }

    /// `DIR/NAME.key`.
    pub fn key_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.key"))
    }

    fn check_name(name: &str) -> Result<(), PkiError> {
        let ok = !name.is_empty()
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if ok {
            Ok(())
        } else {
            Err(invalid(
                "certificate name",
                format!("{name:?}: use letters, digits, '-', '_' and '.', not starting with '.'"),
            ))
        }
    }

    fn ensure_dir(&self) -> Result<(), PkiError> {
        if self.path.is_dir() {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let io = |source| PkiError::Io {
                    path: self.path.clone(),
                    source,
                };
                let mode = fs::metadata(&self.path).map_err(io)?.permissions().mode();
                if mode & 0o077 != 0 {
                    fs::set_permissions(&self.path, fs::Permissions::from_mode(0o700))
                        .map_err(io)?;
                }
            }
            return Ok(());
        }
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder.create(&self.path).map_err(|source| PkiError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Writes `NAME.crt` and `NAME.key`, replacing them if present.
    pub fn write(&self, name: &str, issued: &Issued) -> Result<(), PkiError> {
        Self::check_name(name)?;
        self.ensure_dir()?;
        let key_path = self.key_path(name);
        write_file_atomically(&key_path, issued.key_pem.as_bytes(), 0o600).map_err(|source| {
            PkiError::Io {
                path: key_path,
                source,
            }
        })?;
        let cert_path = self.cert_path(name);
        write_file_atomically(&cert_path, issued.cert_pem.as_bytes(), 0o644).map_err(|source| {
            PkiError::Io {
                path: cert_path,
                source,
            }
        })
    }

    /// Reads `NAME.crt` and `NAME.key`.
    pub fn read(&self, name: &str) -> Result<Issued, PkiError> {
        Self::check_name(name)?;
        let read = |path: PathBuf| {
            fs::read_to_string(&path).map_err(|source| PkiError::Io { path, source })
        };
        Ok(Issued {
            cert_pem: read(self.cert_path(name))?,
            key_pem: read(self.key_path(name))?,
        })
    }

    /// Whether both `NAME.crt` and `NAME.key` exist.
    pub fn contains(&self, name: &str) -> bool {
        self.cert_path(name).is_file() && self.key_path(name).is_file()
    }

    pub fn write_ca(&self, ca: &Ca) -> Result<(), PkiError> {
        self.write(
            CA_NAME,
            &Issued {
                cert_pem: ca.cert_pem().to_string(),
                key_pem: ca.key_pem().to_string(),
            },
        )
    }

    pub fn read_ca(&self) -> Result<Ca, PkiError> {
        let files = self.read(CA_NAME)?;
        Ca::load(&files.cert_pem, &files.key_pem)
    }

    /// The CA in this directory, generated (named `common_name`) and written
    /// first if there is none. Safe to repeat: a second call loads the first
    /// call's CA.
    pub fn load_or_create_ca(&self, common_name: &str) -> Result<Ca, PkiError> {
        if self.contains(CA_NAME) {
            return self.read_ca();
        }
        let ca = Ca::generate(common_name)?;
        self.write_ca(&ca)?;
        Ok(ca)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use x509_parser::extensions::GeneralName;

    fn parse(pem: &str) -> Vec<u8> {
        cert_der(pem).unwrap()
    }

    #[test]
    fn ca_is_a_p256_ca_for_ten_years() {
        let ca = Ca::generate("trainhub dev CA").unwrap();
        let der = parse(ca.cert_pem());
        let (_, x) = X509Certificate::from_der(&der).unwrap();
        assert!(x.is_ca());
        assert_eq!(
            x.subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "trainhub dev CA"
        );
        let days =
            (x.validity().not_after.timestamp() - x.validity().not_before.timestamp()) / 86_400;
        assert_eq!(days, CA_VALIDITY_DAYS);
        // ECDSA P-256 with SHA-256.
        assert_eq!(
            x.signature_algorithm.algorithm.to_id_string(),
            "1.2.840.10045.4.3.2"
        );
        x.verify_signature(None).unwrap();
    }

    #[test]
    fn renewal_keeps_subject_and_names_with_a_new_serial_and_lifetime() {
        let ca = Ca::generate("ca").unwrap();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let spoke = ca
            .issue_client_for("spoke-a", &["trainhub:spokes"], 30)
            .unwrap();
        let before = CertInfo::from_pem(&spoke.cert_pem).unwrap();
        assert_eq!((before.not_after - before.not_before) / 86_400, 30);
        assert!(!before.server);
        let renewed = ca.renew(&spoke.cert_pem, 7).unwrap();
        let after = CertInfo::from_pem(&renewed.cert_pem).unwrap();
        assert_eq!(after.common_name, "spoke-a");
        assert_eq!(after.organizations, ["trainhub:spokes"]);
        assert_ne!(after.serial, before.serial);
        assert_ne!(renewed.key_pem, spoke.key_pem);
        assert_eq!((after.not_after - after.not_before) / 86_400, 7);

        let hub = ca.issue_server("hub", &["localhost"], &[ip]).unwrap();
        let renewed = CertInfo::from_pem(&ca.renew(&hub.cert_pem, 90).unwrap().cert_pem).unwrap();
        assert!(renewed.server);
        assert_eq!(renewed.dns_names, ["localhost"]);
        assert_eq!(renewed.ips, [ip]);
        let zero = ca.issue_client_for("x", &[], 0).unwrap_err().to_string();
        assert!(zero.contains("at least 1"), "{zero}");
    }

    #[test]
    fn server_certificate_has_sans_and_server_auth() {
        let ca = Ca::generate("ca").unwrap();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let issued = ca.issue_server("hub", &["localhost"], &[ip]).unwrap();
        let der = parse(&issued.cert_pem);
        let (_, x) = X509Certificate::from_der(&der).unwrap();
        let (_, ca_x) = X509Certificate::from_der(ca.cert_der()).unwrap();
        x.verify_signature(Some(ca_x.public_key())).unwrap();
        assert_eq!(x.issuer(), ca_x.subject());
        assert!(!x.is_ca());
        let eku = x.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let sans = &x
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names;
        assert!(sans.contains(&GeneralName::DNSName("localhost")));
        assert!(sans.contains(&GeneralName::IPAddress(&[127, 0, 0, 1])));
        let days =
            (x.validity().not_after.timestamp() - x.validity().not_before.timestamp()) / 86_400;
        assert_eq!(days, LEAF_VALIDITY_DAYS);
        // The key belongs to the certificate.
        let key = KeyPair::from_pem(&issued.key_pem).unwrap();
        assert_eq!(x.public_key().raw, key.subject_public_key_info().as_slice());
    }

    #[test]
    fn client_certificate_has_one_o_per_group() {
        let ca = Ca::generate("ca").unwrap();
        let issued = ca
            .issue_client("alice", &["team-a", "trainhub:admins", "third"])
            .unwrap();
        let der = parse(&issued.cert_pem);
        let (_, x) = X509Certificate::from_der(&der).unwrap();
        let (_, ca_x) = X509Certificate::from_der(ca.cert_der()).unwrap();
        // Re-signed after the subject edit: the signature still holds.
        x.verify_signature(Some(ca_x.public_key())).unwrap();
        let orgs: Vec<&str> = x
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(orgs, vec!["team-a", "trainhub:admins", "third"]);
        assert_eq!(
            x.subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "alice"
        );
        let eku = x.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
    }

    #[test]
    fn long_subjects_use_long_form_lengths() {
        let ca = Ca::generate("ca").unwrap();
        let groups: Vec<String> = (0..40).map(|i| format!("group-number-{i}")).collect();
        let refs: Vec<&str> = groups.iter().map(String::as_str).collect();
        let issued = ca.issue_client("u", &refs).unwrap();
        let der = parse(&issued.cert_pem);
        let (_, x) = X509Certificate::from_der(&der).unwrap();
        let (_, ca_x) = X509Certificate::from_der(ca.cert_der()).unwrap();
        x.verify_signature(Some(ca_x.public_key())).unwrap();
        assert_eq!(x.subject().iter_organization().count(), 40);
    }

    #[test]
    fn load_round_trips_and_checks_the_pair() {
        let ca = Ca::generate("ca").unwrap();
        let loaded = Ca::load(ca.cert_pem(), ca.key_pem()).unwrap();
        let issued = loaded.issue_client("bob", &[]).unwrap();
        let der = parse(&issued.cert_pem);
        let (_, x) = X509Certificate::from_der(&der).unwrap();
        let (_, ca_x) = X509Certificate::from_der(ca.cert_der()).unwrap();
        x.verify_signature(Some(ca_x.public_key())).unwrap();
        assert_eq!(x.issuer(), ca_x.subject());

        let other = Ca::generate("other").unwrap();
        let e = Ca::load(ca.cert_pem(), other.key_pem()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "CA key: does not belong to the CA certificate"
        );
        let leaf = ca.issue_client("x", &[]).unwrap();
        let e = Ca::load(&leaf.cert_pem, &leaf.key_pem).unwrap_err();
        assert!(e.to_string().contains("is not a CA"), "{e}");
        let e = Ca::load("garbage", ca.key_pem()).unwrap_err();
        assert!(e.to_string().starts_with("CA certificate: "), "{e}");
        let e = Ca::load(ca.cert_pem(), "garbage").unwrap_err();
        assert!(e.to_string().starts_with("CA key: "), "{e}");
    }

    #[test]
    fn bad_names_are_refused() {
        let ca = Ca::generate("ca").unwrap();
        assert_eq!(
            ca.issue_client("", &[]).unwrap_err().to_string(),
            "common name: must not be empty"
        );
        assert_eq!(
            ca.issue_client("u", &["ok", ""]).unwrap_err().to_string(),
            "organizations[1]: must not be empty"
        );
        assert_eq!(
            ca.issue_server("hub", &[], &[]).unwrap_err().to_string(),
            "server certificate: needs at least one DNS name or IP address"
        );
        assert!(
            ca.issue_server("hub", &["ok", "bä"], &[])
                .unwrap_err()
                .to_string()
                .starts_with("dnsNames[1]: ")
        );
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn pem_dir_writes_private_keys_and_reloads() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PemDir::new(tmp.path().join("pki"));
        assert!(!dir.contains(CA_NAME));
        let ca = dir.load_or_create_ca("dev CA").unwrap();
        assert!(dir.contains(CA_NAME));
        // A second call loads, not regenerates.
        let again = dir.load_or_create_ca("dev CA").unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
        let server = ca
            .issue_server("hub", &["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])
            .unwrap();
        dir.write("hub", &server).unwrap();
        assert_eq!(dir.read("hub").unwrap(), server);
        assert_eq!(dir.read_ca().unwrap().cert_pem(), ca.cert_pem());
        #[cfg(unix)]
        {
            assert_eq!(mode(&dir.key_path("hub")), 0o600);
            assert_eq!(mode(&dir.key_path(CA_NAME)), 0o600);
            assert_eq!(mode(&dir.cert_path("hub")), 0o644);
            assert_eq!(mode(dir.path()), 0o700);
        }
        // No temporary files are left behind.
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(dir.write("../evil", &server).is_err());
        assert!(dir.read(".hidden").is_err());
        let missing = dir.read("nope").unwrap_err().to_string();
        assert!(missing.contains("nope.crt"), "{missing}");
    }

    #[cfg(unix)]
    #[test]
    fn an_open_pem_dir_is_narrowed_to_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("pki");
        fs::create_dir(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let dir = PemDir::new(&path);
        dir.load_or_create_ca("dev CA").unwrap();
        assert_eq!(mode(&path), 0o700);
        assert_eq!(mode(&dir.key_path(CA_NAME)), 0o600);
    }

    #[test]
    fn atomic_write_replaces_and_tightens_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        fs::write(&path, "old").unwrap();
        write_file_atomically(&path, b"new", 0o600).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        #[cfg(unix)]
        assert_eq!(mode(&path), 0o600);
        let e = write_file_atomically(&tmp.path().join("no/such/dir/f"), b"x", 0o600);
        assert!(e.is_err());
    }
}

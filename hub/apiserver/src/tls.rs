// STUB
pub struct PeerCertificate(pub Option<std::sync::Arc<Vec<u8>>>);

//! (filled by the sandbox work)

//! Integration tests against a real registry on loopback.

//! (filled by the authority work)

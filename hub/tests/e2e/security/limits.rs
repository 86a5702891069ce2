//! (filled by the limits work)

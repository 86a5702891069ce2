//! The same simulator scenario against kmock.

//! Fault tests (issue 18), one file per area.

mod hubd;

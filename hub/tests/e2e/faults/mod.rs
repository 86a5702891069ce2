//! Fault tests (issue 18): each area in its own module.

mod plugins;
mod runtime;

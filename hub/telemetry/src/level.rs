//! The log level, changeable while running.
//!
//! A level is given as kube-apiserver's `--v` verbosity (`PUT
//! /debug/flags/v` with the number as body): 0–1 is `info`, 2–3 `debug`
//! for trainhub's own crates, 4 and more `debug` everywhere, 6 and more
//! `trace` for trainhub's own crates; or as a `RUST_LOG` filter
//! (`info,trainhub=debug`).

use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::Error;

/// Changes the installed filter.
#[derive(Clone)]
pub struct LevelHandle(reload::Handle<EnvFilter, Registry>);

impl std::fmt::Debug for LevelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LevelHandle")
    }
}

/// The filter a verbosity or filter text stands for.
pub fn filter_text(spec: &str) -> Result<String, Error> {
    let spec = spec.trim();
    let text = match spec.parse::<u8>() {
        Ok(0 | 1) => "info".to_string(),
        Ok(2 | 3) => "info,trainhub=debug,trainhub_spoke=debug,trainhub_apiserver=debug".into(),
        Ok(4 | 5) => "debug".to_string(),
        Ok(6..=10) => {
            "debug,trainhub=trace,trainhub_spoke=trace,trainhub_apiserver=trace".to_string()
        }
        Ok(_) => return Err(Error::Level(spec.into(), "verbosity is 0 to 10".into())),
        Err(_) => {
            EnvFilter::try_new(spec).map_err(|e| Error::Level(spec.into(), e.to_string()))?;
            spec.to_string()
        }
    };
    Ok(text)
}

impl LevelHandle {
    pub(crate) fn new(handle: reload::Handle<EnvFilter, Registry>) -> Self {
        LevelHandle(handle)
    }

    /// Sets the level from a verbosity or a filter; returns the filter now
    /// in force.
    ///
    /// # Errors
    /// The text is neither a verbosity from 0 to 10 nor a valid filter.
    pub fn set(&self, spec: &str) -> Result<String, Error> {
        let text = filter_text(spec)?;
        let filter =
            EnvFilter::try_new(&text).map_err(|e| Error::Level(text.clone(), e.to_string()))?;
        self.0
            .reload(filter)
            .map_err(|e| Error::Level(text.clone(), e.to_string()))?;
        Ok(text)
    }

    /// The filter in force.
    pub fn current(&self) -> String {
        self.0.with_current(|f| f.to_string()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosities_and_filters_are_understood() {
        assert_eq!(filter_text("0").unwrap(), "info");
        assert!(filter_text(" 4\n").unwrap().starts_with("debug"));
        assert_eq!(
            filter_text("warn,trainhub=debug").unwrap(),
            "warn,trainhub=debug"
        );
        assert!(filter_text("11").is_err());
        assert!(filter_text("trainhub=loud").is_err());
    }
}
